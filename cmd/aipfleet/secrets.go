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
// file refused); errors name the --database-url-file flag.
func readDatabaseURL(path string) (string, error) {
	raw, err := aip.ReadSecretFile(path, maxDatabaseURLFileBytes)
	if err != nil {
		return "", settingError(fmt.Errorf("--database-url-file: %w", err))
	}
	url := string(raw)
	clear(raw)
	return url, nil
}

// serverFiles are the secret files of a server command (control-plane,
// dispatch): its registry database URL, its signing key and, optionally,
// its TLS certificate and key.
type serverFiles struct {
	databaseURL, signingKey, tlsCert, tlsKey string
}

// load reads them; every error names the flag to fix.
func (f serverFiles) load() (dbURL string, key *aip.SigningKey, tlsConfig *tls.Config, err error) {
	if dbURL, err = readDatabaseURL(f.databaseURL); err != nil {
		return "", nil, nil, err
	}
	if key, err = aip.LoadSigningKey(f.signingKey); err != nil {
		return "", nil, nil, settingError(fmt.Errorf("--signing-key-file: %w", err))
	}
	if f.tlsCert != "" {
		if tlsConfig, err = loadTLS(f.tlsCert, f.tlsKey); err != nil {
			return "", nil, nil, err
		}
	}
	return dbURL, key, tlsConfig, nil
}

func loadTLS(certFile, keyFile string) (*tls.Config, error) {
	certPEM, err := aip.ReadPublicFile(certFile, maxTLSFileBytes)
	if err != nil {
		return nil, settingError(fmt.Errorf("--tls-cert-file: %w", err))
	}
	keyPEM, err := aip.ReadSecretFile(keyFile, maxTLSFileBytes)
	if err != nil {
		return nil, settingError(fmt.Errorf("--tls-key-file: %w", err))
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, settingError(fmt.Errorf("--tls-cert-file %s and --tls-key-file %s: %w", certFile, keyFile, err))
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
