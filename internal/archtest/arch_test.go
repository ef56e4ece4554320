package archtest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/aipfleet/aipfleet"

// goList runs `go list` with the arguments and returns its output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// violations returns the dependencies of pkg (non-test, transitive) that
// match one of the forbidden prefixes.
func violations(t *testing.T, pkg string, forbidden []string) []string {
	t.Helper()
	var bad []string
	for _, dep := range goList(t, "-deps", "-f", "{{.ImportPath}}", pkg) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				bad = append(bad, dep)
			}
		}
	}
	return bad
}

func TestAIPImportsNothingOfThisModule(t *testing.T) {
	for _, dep := range goList(t, "-deps", "-f", "{{.ImportPath}}", module+"/aip") {
		if strings.HasPrefix(dep, module+"/") && dep != module+"/aip" {
			t.Errorf("aip depends on %s; aip must import nothing of this module", dep)
		}
	}
}

var hostsdkForbidden = []string{
	"github.com/jackc/pgx/v5",
	"github.com/go-chi/chi/v5",
	module + "/registry",
	module + "/controlplane",
}

// hostsdktestForbidden is hostsdkForbidden for hostsdk/hostsdktest, the
// test kit: its fake control plane decides lifecycle requests with the
// registry package's own rule functions (registry.DecideLifecycle), so that
// it cannot drift from the real control plane — the registry's contracts
// and rules, which import only aip, never a registry backend, the
// dispatcher or the control plane.
var hostsdktestForbidden = []string{
	"github.com/jackc/pgx/v5",
	"github.com/go-chi/chi/v5",
	module + "/registry/memregistry",
	module + "/registry/pgregistry",
	module + "/registry/dispatch",
	module + "/controlplane",
}

func TestHostSDKImportDirection(t *testing.T) {
	pkgs := goList(t, module+"/hostsdk/...")
	checked := 0
	for _, pkg := range pkgs {
		if pkg == module+"/hostsdk/pgruntime" || strings.HasPrefix(pkg, module+"/hostsdk/pgruntime/") {
			continue // the optional PostgreSQL journal is the one place pgx may appear
		}
		checked++
		forbidden := hostsdkForbidden
		if pkg == module+"/hostsdk/hostsdktest" {
			forbidden = hostsdktestForbidden
			// The registry package it may use imports nothing of this
			// module but aip.
			for _, dep := range goList(t, "-deps", "-f", "{{.ImportPath}}", module+"/registry") {
				if strings.HasPrefix(dep, module+"/") && dep != module+"/registry" && dep != module+"/aip" {
					t.Errorf("registry depends on %s, which hostsdktest would then import", dep)
				}
			}
		}
		for _, dep := range violations(t, pkg, forbidden) {
			t.Errorf("%s depends on %s; hostsdk must not import pgx, chi, the registry, the dispatcher or the control plane (see ARCHITECTURE.md)", pkg, dep)
		}
	}
	if checked == 0 {
		t.Fatal("no hostsdk packages found to check")
	}
}

// TestCheckerDetectsViolations keeps the checks above honest: the same
// mechanism must flag a package that is known to import pgx.
func TestCheckerDetectsViolations(t *testing.T) {
	if bad := violations(t, module+"/internal/pgtest", hostsdkForbidden); len(bad) == 0 {
		t.Fatal("the checker did not notice that internal/pgtest depends on pgx")
	}
}

// TestProductsImportDirection: product adapters build on hostsdk alone
// (aip ← hostsdk ← products); they never reach into the registry, the
// control plane, pgx or chi, and no product imports another.
func TestProductsImportDirection(t *testing.T) {
	pkgs := goList(t, module+"/products/...")
	var adapters []string
	for _, pkg := range pkgs {
		for _, dep := range violations(t, pkg, hostsdkForbidden) {
			t.Errorf("%s depends on %s; products must not import pgx, chi, the registry, the dispatcher or the control plane (see ARCHITECTURE.md)", pkg, dep)
		}
		if rest := strings.TrimPrefix(pkg, module+"/products/"); rest != pkg && !strings.HasPrefix(rest, "internal") && !strings.Contains(rest, "/") {
			adapters = append(adapters, pkg)
		}
	}
	for _, pkg := range adapters {
		deps := goList(t, "-deps", "-f", "{{.ImportPath}}", pkg)
		for _, other := range adapters {
			if other != pkg && slices.Contains(deps, other) {
				t.Errorf("%s depends on %s; product adapters share code through products/internal only", pkg, other)
			}
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("no products packages found to check")
	}
}
