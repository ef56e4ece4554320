package main

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/internal/hostrun"
)

// TestDocsUseRealCommands checks every aipfleet command line in the README
// and the guides' shell blocks: the command exists and every flag it uses
// is one of that command's flags.
func TestDocsUseRealCommands(t *testing.T) {
	envAssign := regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=\S*\s+`)
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, doc := range append([]string{filepath.Join("..", "..", "README.md")}, docs...) {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		inSh := false
		var lines []string
		for _, line := range strings.Split(string(raw), "\n") {
			switch {
			case !inSh && strings.TrimSpace(line) == "```sh":
				inSh = true
			case inSh && strings.TrimSpace(line) == "```":
				inSh = false
			case inSh:
				lines = append(lines, line)
			}
		}
		joined := strings.ReplaceAll(strings.Join(lines, "\n"), "\\\n", " ")
		for _, line := range strings.Split(joined, "\n") {
			line = strings.TrimSpace(line)
			for envAssign.MatchString(line) {
				line = envAssign.ReplaceAllString(line, "")
			}
			line = strings.Replace(line, "go run ./cmd/aipfleet ", "aipfleet ", 1)
			if i := strings.Index(line, "aipfleet "); i < 0 || (i > 0 && !strings.HasSuffix(line[:i], "do ")) {
				continue
			} else {
				line = line[i:]
			}
			if c, _, ok := strings.Cut(line, " #"); ok {
				line = c
			}
			if c, _, ok := strings.Cut(line, "; done"); ok {
				line = c
			}
			fields := strings.Fields(line)
			if len(fields) < 2 || strings.HasPrefix(fields[1], "-") {
				continue
			}
			c := lookup(fields[1])
			if c == nil {
				t.Errorf("%s: %q: aipfleet has no command %s", doc, line, fields[1])
				continue
			}
			help, _, _ := runCLI(t, nil, fields[1], "--help")
			for _, f := range fields[2:] {
				if !strings.HasPrefix(f, "-") {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
				if name == "help" || name == "h" {
					continue
				}
				if f == "-f" { // registry's shorthand of --file
					name = "file"
				}
				if !regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(name) + `\s`).MatchString(help) {
					t.Errorf("%s: %q: aipfleet %s has no flag --%s", doc, line, fields[1], name)
				}
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d command lines; the docs' ```sh blocks were not found", checked)
	}
}

// TestEveryCommandExplainsItself: each command's help has a summary, a
// paragraph, its flags and examples that run the command.
func TestEveryCommandExplainsItself(t *testing.T) {
	for _, c := range commandList() {
		if c.summary == "" || len(strings.TrimSpace(c.long)) < 80 || len(c.examples) < 2 {
			t.Errorf("%s: summary %q, %d bytes of explanation, %d examples", c.name, c.summary, len(strings.TrimSpace(c.long)), len(c.examples))
		}
		for _, ex := range c.examples {
			if !strings.Contains(ex, "aipfleet "+c.name) && !strings.Contains(ex, "aipfleet --"+c.name) {
				t.Errorf("%s: example %q does not run it", c.name, ex)
			}
		}
		for _, line := range strings.Split(c.long, "\n") {
			if len(line) > 90 { // the explanation is wrapped for a terminal (aligned tables may run a little longer)
				t.Errorf("%s: a line of the explanation is %d bytes long, want at most 90: %q", c.name, len(line), line)
			}
		}
		help, _, _ := runCLI(t, nil, c.name, "--help")
		if !strings.Contains(help, "\nFlags:\n") {
			t.Errorf("%s --help lists no flags:\n%s", c.name, help)
		}
	}
}

// TestDocsInlineCommandsMatchHelp: a command the docs spell inline with a
// placeholder (`aipfleet registry apply -f FILE`) is written as the
// command's help writes it, so it works when filled in.
func TestDocsInlineCommandsMatchHelp(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	span := regexp.MustCompile("`(?:go run \\./cmd/)?(aipfleet [^`]+)`")
	placeholder := regexp.MustCompile(`^[A-Z][A-Z_]+$`)
	checked := 0
	for _, doc := range append(docs, filepath.Join("..", "..", "README.md")) {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range span.FindAllStringSubmatch(string(raw), -1) {
			fields := strings.Fields(m[1])
			if len(fields) < 2 || !slices.ContainsFunc(fields, placeholder.MatchString) {
				continue
			}
			var pattern []string
			for _, f := range fields {
				if placeholder.MatchString(f) {
					pattern = append(pattern, `[A-Z][A-Z_]+`)
				} else {
					pattern = append(pattern, regexp.QuoteMeta(f))
				}
			}
			help, _, _ := runCLI(t, nil, fields[1], "--help")
			if !regexp.MustCompile(strings.Join(pattern, `\s+`)).MatchString(help) {
				t.Errorf("%s: `%s` is not how `aipfleet %s --help` writes the command", filepath.Base(doc), m[1], fields[1])
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no inline command with a placeholder found in the docs")
	}
}

// TestDocsNameEveryPrintManifestField: the operator guide's section 4,
// where --print-manifest is documented, said what manifest,
// manifest_digest and implementation_support are for but not
// capability_count, which the JSON holds too. Every field of
// hostrun.ManifestReport is named, in backticks, in the paragraph that
// describes the JSON.
func TestDocsNameEveryPrintManifestField(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "operator-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "\nThe JSON holds ")
	if !ok {
		t.Fatal(`docs/operator-guide.md has no paragraph starting "The JSON holds" (what --print-manifest prints)`)
	}
	paragraph, _, _ := strings.Cut(after, "\n\n")
	rt := reflect.TypeFor[hostrun.ManifestReport]()
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if !strings.Contains(paragraph, "`"+name+"`") {
			t.Errorf("the operator guide's paragraph on what --print-manifest prints does not name `%s`:\n%s", name, paragraph)
		}
	}
}
