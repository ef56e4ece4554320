package pgregistry_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// TestConnectionStringErrorsHideThePassword feeds every entry point that
// takes a connection string one that does not parse, with a planted
// password: no error may quote it. pgx quotes the string in its parse
// errors with the password masked only as far as it recognises it (a
// keyword/value "password = x" or "password= x" keeps it in clear).
func TestConnectionStringErrorsHideThePassword(t *testing.T) {
	const secret = "Pl4ntedS3cret"
	bad := []string{
		"host=db.internal password = " + secret + " sslmode=bogus",
		"host=db.internal password= " + secret + " sslmode=bogus",
		"host=db.internal password=" + secret + `\ tail port=x`,
		"postgres://admin:" + secret + "@db.internal/aipfleet?sslmode=bogus",
		"postgres://admin:" + secret + "@db.internal:port/aipfleet",
		"postgres://admin@db.internal/aipfleet?password=" + secret + "&sslmode=bogus",
	}
	ctx := context.Background()
	for _, raw := range bad {
		calls := map[string]func() error{
			"Open": func() error {
				_, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: raw})
				return err
			},
			"Open data": func() error {
				_, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: "postgres://u@127.0.0.1:1/x?sslmode=bogus", DataURL: raw})
				return err
			},
			"OpenDataPlane": func() error {
				_, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: raw})
				return err
			},
			"Migrate": func() error { return pgregistry.Migrate(ctx, raw) },
			"LockApply": func() error {
				_, err := pgregistry.LockApply(ctx, raw, nil)
				return err
			},
		}
		for name, call := range calls {
			err := call()
			if err == nil {
				t.Fatalf("%s(%q) succeeded", name, raw)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error quotes the password:\n%v", name, err)
			}
			if name != "Open data" && !errors.Is(err, registry.ErrInvalid) {
				t.Errorf("%s: error %v is not registry.ErrInvalid", name, err)
			}
		}
	}
}
