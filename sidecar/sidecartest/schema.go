package sidecartest

import (
	"bytes"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aipfleet/aipfleet/sidecar"
)

// Validator checks messages of the local connector contract against its
// JSON Schemas (sidecar.Schemas).
type Validator struct {
	schemas map[string]*jsonschema.Schema
}

// NewValidator compiles every schema of the contract
// (sidecar.CompileSchemas).
func NewValidator() (*Validator, error) {
	schemas, err := sidecar.CompileSchemas()
	if err != nil {
		return nil, err
	}
	return &Validator{schemas: schemas}, nil
}

// Validate checks raw JSON against the schema named without its suffix,
// for example "action-request" or "stream-line".
func (v *Validator) Validate(schema string, raw []byte) error {
	s, ok := v.schemas[schema]
	if !ok {
		return fmt.Errorf("sidecartest: no schema %q", schema)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("sidecartest: %s: not JSON: %w", schema, err)
	}
	if err := s.Validate(doc); err != nil {
		return fmt.Errorf("sidecartest: %s: %w", schema, err)
	}
	return nil
}

// Names returns the schema names.
func (v *Validator) Names() []string {
	var out []string
	for n := range v.schemas {
		out = append(out, n)
	}
	return out
}
