package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/aipfleet/aipfleet/aip"
)

func keygenCommand() *command {
	return &command{
		name:    "keygen",
		summary: "create an Ed25519 signing key file and print its did:key",
		usage:   "--out FILE",
		long: `Writes a new Ed25519 seed as 64 hexadecimal characters to FILE with mode
0600 (it refuses to overwrite an existing file) and prints the key's did:key
identity. Use the file as a --signing-key-file / --signing-seed-file, and the
did:key wherever a peer must pin this identity.`,
		examples: []string{
			"aipfleet keygen --out control-plane.key",
			"aipfleet keygen --out replica-1.key --json",
		},
		run: runKeygen,
	}
}

func runKeygen(ctx context.Context, c *command, e *env, args []string) error {
	fs := newFlagSet(c, e.getenv)
	out := fs.String("out", "", "file to create (mode 0600)")
	asJSON := fs.Bool("json", false, "print {\"did\":..., \"file\":...} instead of the bare DID")
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if err := fs.noArgs(); err != nil {
		return err
	}
	if *out == "" {
		return usagef("keygen: --out FILE is required (the file the new key is written to)")
	}
	key, err := aip.GenerateSigningKey()
	if err != nil {
		return err
	}
	if err := aip.WriteSeedFile(*out, key); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("--out: %w (choose another --out, or delete the old file if you really mean to replace that identity)", err)
		}
		return fmt.Errorf("--out: %w", err)
	}
	if *asJSON {
		return writeJSON(e.stdout, map[string]string{"did": key.DID(), "file": *out})
	}
	fmt.Fprintln(e.stdout, key.DID())
	return nil
}
