package sidecartest

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aipfleet/aipfleet/sidecar"
)

// Validator checks messages of the local connector contract against its
// JSON Schemas (sidecar.Schemas).
type Validator struct {
	schemas map[string]*jsonschema.Schema
}

// NewValidator compiles every schema of the contract.
func NewValidator() (*Validator, error) {
	files := sidecar.Schemas()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	names, err := fs.Glob(files, "*.schema.json")
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		raw, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := c.AddResource(sidecar.SchemaBaseURL+name, doc); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	v := &Validator{schemas: map[string]*jsonschema.Schema{}}
	for _, name := range names {
		s, err := c.Compile(sidecar.SchemaBaseURL + name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		v.schemas[strings.TrimSuffix(name, ".schema.json")] = s
	}
	return v, nil
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
