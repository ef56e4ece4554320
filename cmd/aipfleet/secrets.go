package main

import (
	"crypto/tls"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
)

// Bounds of the files the server commands read.
const (
	maxDatabaseURLFileBytes = 16 << 10
	maxTLSFileBytes         = 1 << 20
)

// readDatabaseURL reads a PostgreSQL URL from an owner-only secret file
// (aip.ReadSecretFile: surrounding whitespace removed, a whitespace-only
// file refused); errors start with command ("registry status",
// "control-plane"), as its other usage errors do, and name the
// --database-url-file flag.
func readDatabaseURL(command, path string) (string, error) {
	raw, err := aip.ReadSecretFile(path, maxDatabaseURLFileBytes)
	if err != nil {
		return "", flagFileError(command, "--database-url-file", err)
	}
	url := string(raw)
	clear(raw)
	return url, nil
}

// serverFiles are the secret files of a server command (control-plane,
// dispatch: command): its registry database URL, its signing key and,
// optionally, its TLS certificate and key.
type serverFiles struct {
	command                                  string
	databaseURL, signingKey, tlsCert, tlsKey string
}

// load reads them; every error starts with the command, as its other
// usage errors do, and names the flag to fix.
func (f serverFiles) load() (dbURL string, key *aip.SigningKey, tlsConfig *tls.Config, err error) {
	if dbURL, err = readDatabaseURL(f.command, f.databaseURL); err != nil {
		return "", nil, nil, err
	}
	if key, err = aip.LoadSigningKey(f.signingKey); err != nil {
		return "", nil, nil, flagFileError(f.command, "--signing-key-file", err)
	}
	if f.tlsCert != "" {
		if tlsConfig, err = loadTLS(f.command, f.tlsCert, f.tlsKey); err != nil {
			return "", nil, nil, err
		}
	}
	return dbURL, key, tlsConfig, nil
}

func loadTLS(command, certFile, keyFile string) (*tls.Config, error) {
	certPEM, err := aip.ReadPublicFile(certFile, maxTLSFileBytes)
	if err != nil {
		return nil, flagFileError(command, "--tls-cert-file", err)
	}
	keyPEM, err := aip.ReadSecretFile(keyFile, maxTLSFileBytes)
	if err != nil {
		return nil, flagFileError(command, "--tls-key-file", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, settingError(fmt.Errorf("%s: --tls-cert-file %s and --tls-key-file %s: %w", command, certFile, keyFile, err))
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
