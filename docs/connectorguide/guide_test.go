package connectorguide_test

import (
	"bytes"
	"context"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/docs/connectorguide/notes"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// root is the repository root, relative to this package.
const root = "../.."

func readGuide(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "docs", "connector-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// blockAfter returns the fenced code block that follows the marker line.
func blockAfter(t *testing.T, doc, marker string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, marker+"\n")
	if !ok {
		t.Fatalf("the guide has no %q marker", marker)
	}
	_, rest, ok = strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("no code block after %q", marker)
	}
	_, rest, _ = strings.Cut(rest, "\n") // the fence's language
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("the code block after %q is not closed", marker)
	}
	return block
}

var quoteMarker = regexp.MustCompile(`<!-- quote: (\S+) (\S+) -->`)

// declSource returns the source of a top-level declaration with its doc
// comment: a function, a method (Type.Method), a type, the const or var
// group that declares name ("_" for a group of blank guards), or the file's
// import declaration ("import").
func declSource(t *testing.T, path, name string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	text := func(doc *ast.CommentGroup, n ast.Node) string {
		start := n.Pos()
		if doc != nil {
			start = doc.Pos()
		}
		return string(src[fset.Position(start).Offset:fset.Position(n.End()).Offset]) + "\n"
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			fn := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) == 1 {
				typ := d.Recv.List[0].Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					fn = id.Name + "." + fn
				}
			}
			if fn == name {
				return text(d.Doc, d)
			}
		case *ast.GenDecl:
			if d.Tok == token.IMPORT && name == "import" {
				return text(d.Doc, d)
			}
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.Name == name {
						return text(d.Doc, d)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.Name == name {
							return text(d.Doc, d)
						}
					}
				}
			}
		}
	}
	t.Fatalf("%s declares no %s", path, name)
	return ""
}

func TestGuideQuotesTheCode(t *testing.T) {
	doc := readGuide(t)
	quotes := quoteMarker.FindAllStringSubmatch(doc, -1)
	if len(quotes) < 8 {
		t.Fatalf("the guide quotes %d declarations; the markers are <!-- quote: PATH NAME -->", len(quotes))
	}
	for _, q := range quotes {
		got := blockAfter(t, doc, q[0])
		if want := declSource(t, q[1], q[2]); got != want {
			t.Errorf("the guide's quote of %s %s differs from the code:\n--- guide\n%s--- code\n%s", q[1], q[2], got, want)
		}
	}
}

// guideFleet parses the guide's fleet file.
func guideFleet(t *testing.T) *registry.FleetFile {
	t.Helper()
	f, err := registry.ParseFleetFile([]byte(blockAfter(t, readGuide(t), "<!-- notes-fleet-file -->")))
	if err != nil {
		t.Fatalf("the guide's fleet file: %v", err)
	}
	return f
}

func TestGuideFleetFileAdmitsTheServedManifest(t *testing.T) {
	ctx := context.Background()
	f := guideFleet(t)
	if len(f.Versions) != 1 || len(f.Instances) != 1 || len(f.Replicas) != 1 || len(f.Bindings) != 2 {
		t.Fatalf("fleet file %+v", f)
	}
	m, err := notes.Connector{}.Manifest(ctx, hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	m.Agent.TrustDomain = f.Replicas[0].TrustDomain
	want, err := aip.ManifestDigest(m)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Versions[0].ManifestDigest; got != want {
		t.Fatalf("the guide's manifest has digest %s; the host serves %s (regenerate it with noteshost --print-manifest)", got, want)
	}
	for _, id := range []struct{ prefix, id string }{
		{aip.PrefixType, f.Types[0].ID}, {aip.PrefixVersion, f.Versions[0].ID},
		{aip.PrefixInstance, f.Instances[0].ID}, {aip.PrefixReplica, f.Replicas[0].ID},
	} {
		if err := aip.ValidateID(id.prefix, id.id); err != nil {
			t.Errorf("%s cannot be a host's ID: %v", id.id, err)
		}
	}
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Apply(ctx, reg, f); err != nil {
		t.Fatalf("apply the guide's fleet file: %v", err)
	}
	page, err := reg.QueryCapabilities(ctx, registry.CatalogQuery{}, registry.ForTenant("acme"))
	if err != nil || page.Total != 2 {
		t.Fatalf("acme's catalog: %d capabilities, %v", page.Total, err)
	}
}

func TestGuideHostCommandMatchesTheFleetFile(t *testing.T) {
	block := blockAfter(t, readGuide(t), "<!-- notes-host-command -->")
	line := strings.ReplaceAll(block, "\\\n", " ")
	args := strings.Fields(line)
	if len(args) < 3 || strings.Join(args[:3], " ") != "go run ./docs/connectorguide/noteshost" {
		t.Fatalf("the host command does not run noteshost: %q", line)
	}
	fs := flag.NewFlagSet("noteshost", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	load := hostsdk.BindFlags(fs)
	fs.Bool("print-manifest", false, "")
	if err := fs.Parse(args[3:]); err != nil {
		t.Fatalf("the guide's host flags: %v", err)
	}
	cfg, err := load(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hostsdk.New(cfg, notes.Connector{}); err != nil {
		t.Fatalf("the guide's host configuration is refused: %v", err)
	}
	f := guideFleet(t)
	v, inst, rep := f.Versions[0], f.Instances[0], f.Replicas[0]
	for _, c := range []struct{ flag, got, want string }{
		{"--connector-type-id", cfg.ConnectorTypeID, f.Types[0].ID},
		{"--version-id", cfg.VersionID, v.ID},
		{"--instance-id", cfg.InstanceID, inst.ID},
		{"--replica-id", cfg.ReplicaID, rep.ID},
		{"--tenant-id", cfg.TenantID, inst.TenantID},
		{"--secret-provider-ref", cfg.SecretProviderRef, inst.SecretProviderRef},
		{"--trust-domain", cfg.TrustDomain, rep.TrustDomain},
		{"--public-endpoint", cfg.PublicEndpoint, rep.Endpoint},
		{"--artifact-digest", cfg.ArtifactDigest, v.Attestation.ArtifactDigest},
		{"--gateway-principal-id", cfg.GatewayPrincipalID, "service:aipfleet-dispatch"},
	} {
		if c.got != c.want {
			t.Errorf("the guide's host command has %s %s; its fleet file says %s", c.flag, c.got, c.want)
		}
	}
}
