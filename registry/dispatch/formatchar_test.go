package dispatch_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// formatChars are invisible formatting characters (Unicode Cf) the
// registry refuses in an identifier, each with the code point an error
// must name: a zero-width space, a soft hyphen, a bidi override, a byte
// order mark and a tag character beyond U+FFFF.
var formatChars = []struct {
	r    rune
	code string
}{
	{'\u200b', "U+200B"}, {'\u00ad', "U+00AD"}, {'\u202e', "U+202E"}, {'\ufeff', "U+FEFF"}, {'\U000E0041', "U+E0041"},
}

// errorOf decodes an error answer.
func errorOf(t *testing.T, body []byte) *aip.ProtocolError {
	t.Helper()
	var e dispatch.ErrorResponse
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("not an error answer: %s", body)
	}
	return e.Error
}

// TestTenantClaimWithFormatCharacterIsRefused: a verified token whose
// tenant_id holds an invisible formatting character is 401 with a reason
// naming the claim and the character, on every authenticated route. It was
// let through: an action was admitted and refused by the registry as 422
// dispatch.action_invalid about a route request's tenant_id, and the
// catalog and the event log answered 200 with nothing in them.
func TestTenantClaimWithFormatCharacterIsRefused(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	for _, fc := range formatChars {
		claim := "Bearer " + mintClaim(t, w, tenant+string(fc.r))
		id := aip.NewActionID()
		for _, c := range []struct{ method, path, body string }{
			{http.MethodPost, dispatch.PathActions, fmt.Sprintf(`{"action_id":%q,"capability_id":%q,"input":{"text":"x"}}`, id, capSay)},
			{http.MethodGet, dispatch.PathCapabilities, ""},
			{http.MethodGet, dispatch.PathEvents, ""},
		} {
			req, err := http.NewRequestWithContext(w.ctx, c.method, w.srv.URL+c.path, strings.NewReader(c.body))
			must(t, err)
			req.Header.Set("Authorization", claim)
			resp, err := w.api.Do(req)
			must(t, err)
			var body json.RawMessage
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			must(t, err)
			e := errorOf(t, body)
			want := "the token's tenant_id claim is not a tenant ID: it holds the invisible formatting character " + fc.code
			if resp.StatusCode != http.StatusUnauthorized || e.Code != dispatch.CodeUnauthorized || !strings.HasPrefix(e.Message, want) ||
				!strings.Contains(e.Message, "mint the token for the tenant ID without it") {
				t.Errorf("%s %s as %q: %d %s, want 401 %s starting %q", c.method, c.path, tenant+string(fc.r), resp.StatusCode, body, dispatch.CodeUnauthorized, want)
			}
			if ch := resp.Header.Get("WWW-Authenticate"); !strings.Contains(ch, `error="invalid_token"`) || !strings.Contains(ch, fc.code) {
				t.Errorf("%s %s: challenge %q, want invalid_token naming %s", c.method, c.path, ch, fc.code)
			}
		}
		w.notRouted(id)
	}
	if dispatch.ValidTenantID(tenant + "\u200b") {
		t.Error("ValidTenantID takes a tenant with a zero-width space")
	}
	// A formatting character is what is refused, not non-ASCII text.
	for _, ok := range []string{"café", "租户", "a\u2010b"} {
		if s, body, _ := w.getWith(dispatch.PathCapabilities, "Bearer "+mintClaim(t, w, ok)); s != http.StatusOK {
			t.Errorf("tenant %q: %d %s, want 200", ok, s, body)
		}
	}
	w.idle()
}

// TestCapabilityIDWithFormatCharacterIsRefused: an action whose
// capability_id holds an invisible formatting character is refused by the
// dispatcher before admission (422 dispatch.action_invalid, the code of
// every capability ID it refuses), in a message naming the field, the
// character and the fix, through the API and Execute alike; so is a
// catalog query's capability_id filter (400 dispatch.request_invalid).
// The action was admitted and the registry refused its route request,
// whose tenant_id and action ID the message named; the catalog answered
// an empty page.
func TestCapabilityIDWithFormatCharacterIsRefused(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	for _, fc := range formatChars {
		capID := capSay + string(fc.r)
		want := "capability_id " + strings.TrimSuffix(fmt.Sprintf("%q", capID), `"`)
		check := func(what string, status int, e *aip.ProtocolError, wantStatus int, wantCode string) {
			t.Helper()
			if status != wantStatus || e == nil || e.Code != wantCode || !strings.HasPrefix(e.Message, want) ||
				!strings.Contains(e.Message, "the invisible formatting character "+fc.code) || !strings.HasSuffix(e.Message, "remove it") {
				t.Errorf("%s with capability ID %q: %d %+v, want %d %s naming capability_id and %s", what, capID, status, e, wantStatus, wantCode, fc.code)
			}
		}
		id := aip.NewActionID()
		rawCap, err := json.Marshal(capID)
		must(t, err)
		status, body, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, fmt.Sprintf(`{"action_id":%q,"capability_id":%s,"input":{"text":"x"}}`, id, rawCap))
		check("POST "+dispatch.PathActions, status, errorOf(t, body), http.StatusUnprocessableEntity, dispatch.CodeActionInvalid)
		w.notRouted(id)

		id = aip.NewActionID()
		resp, status := w.d.Execute(w.ctx, tenant, dispatch.ActionRequest{ActionID: id, CapabilityID: capID, Input: say("x", "")}, nil)
		check("Execute", status, resp.Error, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid)
		w.notRouted(id)

		req := dispatch.ActionRequest{CapabilityID: capID, Input: say("x", "")}
		if err := req.Validate(dispatch.DefaultMaxTimeout); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Validate of capability ID %q: %v", capID, err)
		}

		status, body, _ = w.call(http.MethodGet, dispatch.PathCapabilities+"?capability_id="+url.QueryEscape(capID), tenant, nil)
		check("GET "+dispatch.PathCapabilities, status, errorOf(t, body), http.StatusBadRequest, dispatch.CodeRequestInvalid)
		_, e := w.d.Capabilities(w.ctx, tenant, registry.CatalogQuery{CapabilityID: capID})
		if e == nil {
			t.Errorf("Capabilities with capability ID %q: no error", capID)
		}
	}
	// The capability itself is still found and run.
	if s, body, _ := w.call(http.MethodGet, dispatch.PathCapabilities+"?capability_id="+capSay, tenant, nil); s != http.StatusOK || !strings.Contains(string(body), capSay) {
		t.Errorf("capability_id=%s: %d %s", capSay, s, body)
	}
	if status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", "")}); status != http.StatusOK {
		t.Errorf("action of %s: %d %+v", capSay, status, resp.Error)
	}
	w.idle()
}

// TestEmbedderTenantIsHeldToTheClaimRule: Execute, Cancel, Status and
// Capabilities, which an embedder calls with the tenant it verified, refuse
// a tenant that is no tenant ID — empty, one byte over the limit, with a
// control character, surrounding spaces or an invisible formatting
// character — as a token claiming it is refused: 401 dispatch.unauthorized
// naming the tenant and why, before anything is admitted or looked up.
// Only an empty tenant was refused (by Execute alone): the others were
// admitted and refused by the registry, or looked up and not found, or
// answered an empty catalog.
func TestEmbedderTenantIsHeldToTheClaimRule(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	// An action of the tenant's, which Cancel and Status would find.
	status, done := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", "")})
	if status != http.StatusOK {
		t.Fatalf("action: %d %+v", status, done.Error)
	}
	for _, c := range []struct{ name, tenant, want string }{
		{"empty", "", "the tenant (empty: no verified tenant) is not a tenant ID"},
		{"too long", strings.Repeat("a", registry.MaxIdentifierBytes+1), "is longer than 256 bytes"},
		{"control character", tenant + "\n", "is not a tenant ID (UTF-8 text without control characters"},
		{"surrounding space", " " + tenant, "is not a tenant ID (UTF-8 text without control characters or surrounding spaces)"},
		{"zero-width space", tenant + "\u200b", `the tenant "` + tenant + `\u200b" is not a tenant ID: it holds the invisible formatting character U+200B`},
		{"tag character", tenant + "\U000E0041", "it holds the invisible formatting character U+E0041"},
	} {
		check := func(op string, status int, e *aip.ProtocolError) {
			t.Helper()
			if status != http.StatusUnauthorized || e == nil || e.Code != dispatch.CodeUnauthorized || e.Category != aip.CategoryAuth ||
				!strings.Contains(e.Message, c.want) {
				t.Errorf("%s with a tenant %s: %d %+v, want 401 %s containing %q", op, c.name, status, e, dispatch.CodeUnauthorized, c.want)
			}
		}
		id := aip.NewActionID()
		resp, status := w.d.Execute(w.ctx, c.tenant, dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("x", "")}, nil)
		check("Execute", status, resp.Error)
		w.notRouted(id)

		resp, status = w.d.Cancel(w.ctx, c.tenant, done.ActionID, "")
		check("Cancel", status, resp.Error)

		// Status and Capabilities return an error an embedder reads the
		// code of with errors.As.
		asProtocol := func(op string, err error) {
			t.Helper()
			var pe *aip.ProtocolError
			if !errors.As(err, &pe) {
				t.Errorf("%s with a tenant %s: %v, want an *aip.ProtocolError", op, c.name, err)
				return
			}
			check(op, http.StatusUnauthorized, pe)
		}
		if _, e := w.d.Status(w.ctx, c.tenant, done.ActionID); e == nil {
			t.Errorf("Status with a tenant %s: no error", c.name)
		} else {
			asProtocol("Status", e)
		}
		if _, e := w.d.Capabilities(w.ctx, c.tenant, registry.CatalogQuery{Limit: 10}); e == nil {
			t.Errorf("Capabilities with a tenant %s: no error", c.name)
		} else {
			asProtocol("Capabilities", e)
		}
		if dispatch.ValidTenantID(c.tenant) {
			t.Errorf("ValidTenantID takes a tenant %s", c.name)
		}
	}
	// The tenant's own calls, and a tenant of exactly 256 bytes or with
	// non-ASCII text, still pass.
	if _, e := w.d.Status(w.ctx, tenant, done.ActionID); e != nil {
		t.Errorf("Status: %v", e)
	}
	for _, ok := range []string{strings.Repeat("a", registry.MaxIdentifierBytes), "café", "租户"} {
		if _, e := w.d.Capabilities(w.ctx, ok, registry.CatalogQuery{Limit: 10}); e != nil {
			t.Errorf("Capabilities for tenant %q: %v", aip.TruncateUTF8(ok, 16), e)
		}
	}
	w.idle()
}

// TestProfileFilterWithFormatCharacterIsRefused: a catalog query's
// profile filter holding an invisible formatting character, which no
// profile a version declares may hold, is 400 dispatch.request_invalid
// naming the profile parameter, the character and the fix, as the
// capability_id filter's is, through the API and Capabilities alike. It
// was answered an empty page, as if no capability were offered over it.
func TestProfileFilterWithFormatCharacterIsRefused(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	profile := w.version.Manifest.Profiles[0]
	for _, fc := range formatChars {
		p := profile + string(fc.r)
		want := "profile " + strings.TrimSuffix(fmt.Sprintf("%q", p), `"`)
		check := func(what string, status int, e *aip.ProtocolError) {
			t.Helper()
			if status != http.StatusBadRequest || e == nil || e.Code != dispatch.CodeRequestInvalid || !strings.HasPrefix(e.Message, want) ||
				!strings.Contains(e.Message, "the invisible formatting character "+fc.code) || !strings.HasSuffix(e.Message, "remove it") {
				t.Errorf("%s with profile %q: %d %+v, want 400 %s naming profile and %s", what, p, status, e, dispatch.CodeRequestInvalid, fc.code)
			}
		}
		status, body, _ := w.call(http.MethodGet, dispatch.PathCapabilities+"?profile="+url.QueryEscape(p), tenant, nil)
		check("GET "+dispatch.PathCapabilities, status, errorOf(t, body))
		_, e := w.d.Capabilities(w.ctx, tenant, registry.CatalogQuery{Profile: p, Limit: 10})
		var pe *aip.ProtocolError
		if e == nil || !errors.As(e, &pe) {
			t.Errorf("Capabilities with profile %q: %v, want an error", p, e)
			continue
		}
		check("Capabilities", http.StatusBadRequest, pe)
	}
	// The profile itself still filters.
	if s, body, _ := w.call(http.MethodGet, dispatch.PathCapabilities+"?profile="+url.QueryEscape(profile), tenant, nil); s != http.StatusOK || !strings.Contains(string(body), capSay) {
		t.Errorf("profile=%s: %d %s", profile, s, body)
	}
	w.idle()
}

// TestTenantLimitsAgree: the tenant ID bound a host checks its
// --tenant-id with (aip.MaxTenantIDBytes) is the registry's identifier
// bound, which the dispatcher holds a token's tenant claim to.
func TestTenantLimitsAgree(t *testing.T) {
	if aip.MaxTenantIDBytes != registry.MaxIdentifierBytes {
		t.Errorf("aip.MaxTenantIDBytes = %d, registry.MaxIdentifierBytes = %d: a host would take a tenant the registry refuses, or refuse one it holds",
			aip.MaxTenantIDBytes, registry.MaxIdentifierBytes)
	}
	if !dispatch.ValidTenantID(strings.Repeat("t", aip.MaxTenantIDBytes)) || dispatch.ValidTenantID(strings.Repeat("t", aip.MaxTenantIDBytes+1)) {
		t.Errorf("ValidTenantID does not take exactly %d bytes", aip.MaxTenantIDBytes)
	}
}
