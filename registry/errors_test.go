package registry_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/registry"
)

// TestIsContractErrorCoversEverySentinel parses the package so that a new
// exported Err* that IsContractError does not know fails here: a backend
// would otherwise wrap it as ErrStorage.
func TestIsContractErrorCoversEverySentinel(t *testing.T) {
	sentinels := map[string]error{
		"ErrInvalid":            registry.ErrInvalid,
		"ErrAdmission":          registry.ErrAdmission,
		"ErrConflict":           registry.ErrConflict,
		"ErrNotFound":           registry.ErrNotFound,
		"ErrBindingUnavailable": registry.ErrBindingUnavailable,
		"ErrReplicaUnavailable": registry.ErrReplicaUnavailable,
		"ErrCapacityExceeded":   registry.ErrCapacityExceeded,
		"ErrStaleCursor":        registry.ErrStaleCursor,
		"ErrFenceLost":          registry.ErrFenceLost,
		"ErrStorage":            registry.ErrStorage,
		"ErrEvidence":           registry.ErrEvidence,
		"ErrRerouteUnsafe":      registry.ErrRerouteUnsafe,
	}
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if strings.HasPrefix(id.Name, "Err") && id.IsExported() {
						declared = append(declared, id.Name)
					}
				}
			}
		}
	}
	slices.Sort(declared)
	var known []string
	for name := range sentinels {
		known = append(known, name)
	}
	slices.Sort(known)
	if !slices.Equal(declared, known) {
		t.Fatalf("package registry declares sentinels %v, this test (and IsContractError) knows %v: add the new one to both", declared, known)
	}
	for name, s := range sentinels {
		if !registry.IsContractError(s) || !registry.IsContractError(fmt.Errorf("wrapped: %w", s)) {
			t.Errorf("IsContractError(%s) = false, want true", name)
		}
	}
	typed := []error{
		&registry.FieldError{Err: registry.ErrInvalid, Record: registry.RecordRouteRequest, Field: "tenant_id", Reason: "x"},
		&registry.CapacityExceededError{Scope: "tenant", Key: "t", Limit: 1},
		&registry.FleetFileError{Section: registry.SectionTypes, Err: registry.ErrConflict},
		&registry.LifecycleRejection{Rule: registry.RuleState, Err: registry.ErrConflict},
	}
	for _, err := range typed {
		if !registry.IsContractError(err) {
			t.Errorf("IsContractError(%T) = false, want true", err)
		}
	}
	for _, err := range []error{nil, errors.New("registry: invalid"), fmt.Errorf("x: %w", errors.New("y"))} {
		if registry.IsContractError(err) {
			t.Errorf("IsContractError(%v) = true, want false", err)
		}
	}
}
