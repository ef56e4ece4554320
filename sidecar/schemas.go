package sidecar

import (
	"embed"
	"io/fs"
)

//go:embed schemas/*.schema.json
var schemaFiles embed.FS

// SchemaBaseURL is the base of the $id of every local-contract schema.
const SchemaBaseURL = "https://aipfleet.dev/schemas/sidecar/"

// Schemas returns the JSON Schemas (draft 2020-12) of the local connector
// contract, one file per message (action-request.schema.json,
// action-result.schema.json, stream-line.schema.json, ...), as published in
// docs/sidecar-protocol.md. sidecartest.Validator checks messages against
// them.
func Schemas() fs.FS {
	sub, err := fs.Sub(schemaFiles, "schemas")
	if err != nil {
		panic(err) // the directory is embedded
	}
	return sub
}
