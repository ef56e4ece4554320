package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/aipfleet/aipfleet/aip"
)

func keygenCommand() *command {
	return &command{
		name:    "keygen",
		summary: "create an Ed25519 signing key file and print its did:key, or print an existing key's",
		usage:   "--out FILE | --did-of FILE",
		long: `Writes a new Ed25519 seed as 64 hexadecimal characters to FILE with mode
0600 (it refuses to overwrite an existing file) and prints the key's did:key
identity. Use the file as a --signing-key-file / --signing-seed-file, and the
did:key wherever a peer must pin this identity.

aipfleet keygen --did-of FILE creates nothing: it reads an existing key
file (a 64-hex seed or an Ed25519 JWK), checked as every secret file is (a
regular file, readable by its owner only), and prints its did:key: the
peer_did a fleet file needs for a replica's key, or the --control-plane-did
/ --gateway-did of a control plane's or dispatcher's key.`,
		examples: []string{
			"aipfleet keygen --out control-plane.key",
			"aipfleet keygen --out replica-1.key --json",
			"aipfleet keygen --did-of replica-1.key   # the replica's peer_did",
			"aipfleet keygen --did-of .aipfleet/keys/dispatcher.key   # aipfleet dev's dispatcher",
		},
		run: runKeygen,
	}
}

func runKeygen(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	out := fs.String("out", "", "file to create (mode 0600)")
	didOf := fs.String("did-of", "", "print the did:key of this existing key file (mode 0600) instead of creating one")
	asJSON := fs.Bool("json", false, "print {\"did\":..., \"file\":...} instead of the bare DID")
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if err := fs.noArgs(); err != nil {
		return err
	}
	var key *aip.SigningKey
	file := *out
	switch {
	case *out != "" && *didOf != "":
		return usagef("keygen: give --out FILE (create a key) or --did-of FILE (show an existing key's DID), not both")
	case *didOf != "":
		if err := notADirectory(*didOf); err != nil {
			return err
		}
		k, err := aip.LoadSigningKey(*didOf)
		if err != nil {
			return flagFileError("keygen", "--did-of", err)
		}
		key, file = k, *didOf
	case *out == "":
		return usagef("keygen: --out FILE is required (the file the new key is written to), or --did-of FILE to print an existing key's did:key")
	default:
		k, err := aip.GenerateSigningKey()
		if err != nil {
			return err
		}
		if err := aip.WriteSeedFile(*out, k); err != nil {
			return outFileError(*out, err)
		}
		key = k
	}
	if *asJSON {
		return writeJSON(e.stdout, map[string]string{"did": key.DID(), "file": file})
	}
	fmt.Fprintln(e.stdout, key.DID())
	return nil
}

// outFileError is the error of keygen --out FILE that could not be
// created. WriteSeedFile creates the file only when nothing is there (not
// even a symlink): a key is never overwritten. Something already at FILE,
// or a directory of FILE that does not exist, is a setting to fix (exit
// status 2), which running keygen again cannot: they exited 1, the
// existing file with "open FILE: file exists". Other errors (a full disk)
// are failures at run time.
func outFileError(file string, err error) error {
	if st, statErr := os.Stat(file); statErr == nil && st.IsDir() {
		return usagef("keygen: --out %s is a directory: give the key file to create, such as %s", file, shellQuote(filepath.Join(file, "signing.key")))
	}
	switch {
	case errors.Is(err, os.ErrExist):
		q := shellQuote(file)
		return usagef("keygen: --out %s already exists, and keygen never overwrites a file (it may be a key in use): give --out a new file; or, to use the key already there, aipfleet keygen --did-of %s prints its did:key; or, to replace that identity, remove %s first", file, q, q)
	case errors.Is(err, os.ErrNotExist):
		dir := filepath.Dir(file)
		return usagef("keygen: --out %s: the directory %s does not exist: create it (mkdir -p %s), or give --out a file in a directory that exists", file, dir, shellQuote(dir))
	}
	return fmt.Errorf("keygen: --out: %w", err)
}

// notADirectory refuses a --did-of that names a directory (such as aipfleet
// dev's keys directory), naming the key files in it: the key loader would
// only say it is not a regular file. It is a usage error (exit status 2),
// as every other unusable --did-of is.
func notADirectory(path string) error {
	info, err := os.Stat(path)
	if err != nil || !info.IsDir() {
		return nil // the key loader reports what is wrong with it
	}
	msg := fmt.Sprintf("keygen: --did-of %s is a directory: --did-of wants the key file itself", path)
	if keys, _ := filepath.Glob(filepath.Join(path, "*.key")); len(keys) > 0 {
		msg += fmt.Sprintf(", such as %s", keys[0])
		if len(keys) > 1 {
			msg += fmt.Sprintf(" (the directory holds %d .key files)", len(keys))
		}
	}
	return usagef("%s", msg)
}
