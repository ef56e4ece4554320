package hostsdk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredentialPolicyRules holds the credential revision policy to the
// reference's rules: revoked is denied; current or an accepted previous
// revision is allowed; a route without a revision is allowed only when the
// policy has no current revision and no accepted previous one; anything
// else is denied.
func TestCredentialPolicyRules(t *testing.T) {
	for _, c := range []struct {
		name, policy string
		allowed      []string // "" is a route without a revision
		denied       []string
	}{
		{"current and previous", `{"current_revision_ref":"v3","accepted_previous_revisions":["v2"],"revoked_revisions":["v1"]}`,
			[]string{"v3", "v2"}, []string{"v1", "v4", ""}},
		{"current only, members left out", `{"current_revision_ref":"v3"}`,
			[]string{"v3"}, []string{"v2", ""}},
		{"previous only", `{"current_revision_ref":null,"accepted_previous_revisions":["v2"]}`,
			[]string{"v2"}, []string{"v3", ""}},
		{"revocations only", `{"current_revision_ref":null,"accepted_previous_revisions":[],"revoked_revisions":["v1"]}`,
			[]string{""}, []string{"v1", "v2"}},
		{"empty policy", `{}`,
			[]string{""}, []string{"v1"}},
		{"a revision listed twice in one list", `{"current_revision_ref":"v3","revoked_revisions":["v1","v1"]}`,
			[]string{"v3"}, []string{"v1"}},
		{"revisions are compared exactly", `{"current_revision_ref":"V3"}`,
			[]string{"V3"}, []string{"v3", "V3 "}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := parseCredentialPolicy([]byte(c.policy))
			if err != nil {
				t.Fatal(err)
			}
			for _, ref := range c.allowed {
				if err := p.authorize(ref); err != nil {
					t.Errorf("authorize(%q) = %v; want it allowed", ref, err)
				}
			}
			for _, ref := range c.denied {
				if err := p.authorize(ref); !errors.Is(err, errCredentialDenied) {
					t.Errorf("authorize(%q) = %v; want it denied", ref, err)
				}
			}
		})
	}
}

// TestCredentialPolicyRefusesInvalidPolicies: every policy the reference
// refuses (unknown members, refs out of bounds, overlaps) is refused with
// an error that says what is wrong, and so are the documents encoding/json
// alone would read differently from the reference (a member name in
// another case, a member twice, trailing data).
func TestCredentialPolicyRefusesInvalidPolicies(t *testing.T) {
	long := strings.Repeat("r", MaxCredentialRevisionRefBytes+1)
	for _, c := range []struct{ name, policy, want string }{
		{"unknown member", `{"current_revision_ref":"v1","revoked":["v0"]}`, "revoked"},
		{"member name in another case", `{"Current_Revision_Ref":"v1"}`, "case"},
		{"member twice", `{"current_revision_ref":"v1","current_revision_ref":"v2"}`, "duplicate"},
		{"trailing data", `{"current_revision_ref":"v1"} {}`, ""},
		{"not an object", `["v1"]`, "JSON object"},
		{"null", `null`, "JSON object"},
		{"wrong type", `{"revoked_revisions":"v1"}`, ""},
		{"empty current", `{"current_revision_ref":""}`, "current_revision_ref holds a revision of 0 bytes"},
		{"empty previous", `{"accepted_previous_revisions":["v1",""]}`, "accepted_previous_revisions holds a revision of 0 bytes"},
		{"long revoked", `{"revoked_revisions":["` + long + `"]}`, "revoked_revisions holds a revision of 257 bytes; each must be 1 to 256"},
		{"current also revoked", `{"current_revision_ref":"v1","revoked_revisions":["v1"]}`, `"v1" is in both current_revision_ref and revoked_revisions`},
		{"previous also revoked", `{"accepted_previous_revisions":["v1"],"revoked_revisions":["v1"]}`, "both accepted_previous_revisions and revoked_revisions"},
		{"current also previous", `{"current_revision_ref":"v1","accepted_previous_revisions":["v1"]}`, "both current_revision_ref and accepted_previous_revisions"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := parseCredentialPolicy([]byte(c.policy))
			if err == nil {
				t.Fatalf("parsed as %+v; want it refused", p)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
	if _, err := parseCredentialPolicy([]byte(`{"current_revision_ref":"` + long[:MaxCredentialRevisionRefBytes] + `"}`)); err != nil {
		t.Errorf("a revision of %d bytes: %v; want it accepted", MaxCredentialRevisionRefBytes, err)
	}
}

// TestCredentialPolicyFileRules: the policy file is read as the host's
// other configuration files are: a regular file (a symlink is followed and
// its target checked), not writable by group or others, owned by the host's user or root, not
// empty, at most MaxCredentialPolicyBytes.
func TestCredentialPolicyFileRules(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"current_revision_ref":"v1"}`, 0o644)
	loose := write("loose.json", `{"current_revision_ref":"v1"}`, 0o666)
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(loose, link); err != nil {
		t.Fatal(err)
	}
	big := `{"revoked_revisions":["` + strings.Repeat("x", 200) + `"` + strings.Repeat(`,"`+strings.Repeat("y", 200)+`"`, MaxCredentialPolicyBytes/203) + `]}`
	cases := []struct{ name, path, want string }{
		{"missing", filepath.Join(dir, "missing.json"), "does not exist"},
		{"symlink to a world-writable file", link, "chmod go-w"},
		{"directory", dir, "not a regular file"},
		{"group-writable", write("gw.json", `{}`, 0o664), "chmod go-w"},
		{"empty", write("empty.json", "", 0o644), "empty"},
		{"too large", write("big.json", big, 0o644), "more than the 65536 allowed"},
		{"invalid", write("bad.json", `{"current_revision_ref":1}`, 0o644), "bad.json"},
	}
	if os.Geteuid() == 0 {
		// Its owner can rewrite it whatever its mode.
		others := write("others.json", `{"current_revision_ref":"v1"}`, 0o644)
		if err := os.Chown(others, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ name, path, want string }{"another user's", others, "owned by uid 4242"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := readCredentialPolicy(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("readCredentialPolicy = %v; want an error mentioning %q", err, c.want)
			}
		})
	}
	if p, err := readCredentialPolicy(good); err != nil || p.authorize("v1") != nil {
		t.Errorf("good policy: %+v, %v", p, err)
	}
}
