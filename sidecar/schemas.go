package sidecar

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

//go:embed schemas/*.schema.json
var schemaFiles embed.FS

// SchemaBaseURL is the base of the $id of every local-contract schema.
const SchemaBaseURL = "https://aipfleet.dev/schemas/sidecar/"

// Schemas returns the JSON Schemas (draft 2020-12) of the local connector
// contract, one file per message (action-request.schema.json,
// action-result.schema.json, stream-line.schema.json, ...), as published in
// docs/sidecar-protocol.md. sidecartest.Validator checks messages against
// them (CompileSchemas).
func Schemas() fs.FS {
	sub, err := fs.Sub(schemaFiles, "schemas")
	if err != nil {
		panic(err) // the directory is embedded
	}
	return sub
}

// CompileSchemas compiles every schema of Schemas() (draft 2020-12, with
// "format" asserted, $refs resolved among the contract's own files) and
// returns them by name without the ".schema.json" suffix, for example
// "action-request" or "stream-line".
func CompileSchemas() (map[string]*jsonschema.Schema, error) {
	files := Schemas()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	names, err := fs.Glob(files, "*.schema.json")
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("sidecar: no *.schema.json is embedded")
	}
	for _, name := range names {
		raw, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("sidecar: schema %s: %w", name, err)
		}
		if err := c.AddResource(SchemaBaseURL+name, doc); err != nil {
			return nil, fmt.Errorf("sidecar: schema %s: %w", name, err)
		}
	}
	out := make(map[string]*jsonschema.Schema, len(names))
	for _, name := range names {
		s, err := c.Compile(SchemaBaseURL + name)
		if err != nil {
			return nil, fmt.Errorf("sidecar: schema %s: %w", name, err)
		}
		out[strings.TrimSuffix(name, ".schema.json")] = s
	}
	return out, nil
}
