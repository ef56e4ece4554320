package calcom

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // not narrowed by the umask
		t.Fatal(err)
	}
	return p
}

func TestNewFromSettings(t *testing.T) {
	dir := t.TempDir()
	token := writeFile(t, dir, "token", testToken+"\n", 0o600)
	open := writeFile(t, dir, "open", testToken, 0o644)
	secret := writeFile(t, dir, "whsec", testSecret, 0o600)
	secret2 := writeFile(t, dir, "whsec2", "whsec_other", 0o600)
	openSecret := writeFile(t, dir, "whsec-open", testSecret, 0o640)
	spaced := writeFile(t, dir, "spaced", "cal_ab cd", 0o600)

	ok := hostsdk.SettingValues{flagBaseURL: "https://api.cal.com", flagBearerTokenFile: token,
		flagWebhookSecrets:     testSub + "=" + secret + ", other=" + secret2,
		flagSubscriberPrefixes: "https://aip.example.com/webhooks/cal-diy/, https://aip.example.com:8443/"}
	conn, err := Product.New(ok, nil)
	if err != nil {
		t.Fatalf("valid settings: %v", err)
	}
	c := conn.(*Connector)
	if len(c.cfg.WebhookSecrets) != 2 || c.cfg.WebhookSecrets[testSub].Reveal() != testSecret ||
		c.cfg.Token.Reveal() != testToken || c.cfg.BaseURL.String() != "https://api.cal.com" ||
		!slices.Equal(c.cfg.SubscriberPrefixes, []string{"https://aip.example.com/webhooks/cal-diy/", "https://aip.example.com:8443/"}) {
		t.Fatalf("config %+v", c.cfg)
	}
	// A previous secret for a subscription, during a switch.
	old := writeFile(t, dir, "whsec-old", "whsec_previous", 0o600)
	prev := hostsdk.SettingValues{}
	for k, v := range ok {
		prev[k] = v
	}
	prev[flagPreviousWebhookSecrets] = testSub + "=" + old
	if conn, err := Product.New(prev, nil); err != nil || conn.(*Connector).cfg.PreviousWebhookSecrets[testSub].Reveal() != "whsec_previous" ||
		len(conn.(*Connector).cfg.PreviousWebhookSecrets) != 1 {
		t.Fatalf("previous secret: %v", err)
	}
	// Without the setting no subscriber URL is allowed.
	none := hostsdk.SettingValues{flagBaseURL: "https://api.cal.com", flagBearerTokenFile: token}
	if conn, err := Product.New(none, nil); err != nil || len(conn.(*Connector).cfg.SubscriberPrefixes) != 0 {
		t.Fatalf("no prefixes: %v", err)
	}
	// A loopback origin may be plain http.
	loop := hostsdk.SettingValues{flagBaseURL: "http://127.0.0.1:3003/", flagBearerTokenFile: token}
	if _, err := Product.New(loop, nil); err != nil {
		t.Fatalf("loopback http: %v", err)
	}

	with := func(k, v string) hostsdk.SettingValues {
		out := hostsdk.SettingValues{}
		for key, val := range ok {
			out[key] = val
		}
		out[k] = v
		return out
	}
	cases := []struct {
		name   string
		values hostsdk.SettingValues
		want   []string // in the error
	}{
		{"no base URL", with(flagBaseURL, ""), []string{"--cal-diy-base-url", "no URL"}},
		{"insecure base URL", with(flagBaseURL, "http://cal.example.com"), []string{"--cal-diy-base-url", "https"}},
		{"base URL with a path", with(flagBaseURL, "https://api.cal.com/v2"), []string{"--cal-diy-base-url", "origin"}},
		{"base URL with credentials", with(flagBaseURL, "https://k:s@api.cal.com"), []string{"--cal-diy-base-url", "user information"}},
		{"no token file", with(flagBearerTokenFile, ""), []string{"--cal-diy-bearer-token-file", "no file"}},
		{"missing token file", with(flagBearerTokenFile, filepath.Join(dir, "nope")), []string{"--cal-diy-bearer-token-file"}},
		{"token file readable by others", with(flagBearerTokenFile, open), []string{"--cal-diy-bearer-token-file", "chmod"}},
		{"token with a space", with(flagBearerTokenFile, spaced), []string{"--cal-diy-bearer-token-file", "whitespace"}},
		{"webhook entry without file", with(flagWebhookSecrets, testSub), []string{"--cal-diy-webhook-secret-files", "SUBSCRIPTION_ID=FILE"}},
		{"webhook ID syntax", with(flagWebhookSecrets, "-sub="+secret), []string{"--cal-diy-webhook-secret-files", "subscription ID"}},
		{"webhook ID too long", with(flagWebhookSecrets, strings.Repeat("s", 129)+"="+secret), []string{"--cal-diy-webhook-secret-files", "1 to 128"}},
		{"webhook ID twice", with(flagWebhookSecrets, "a="+secret+",a="+secret2), []string{"--cal-diy-webhook-secret-files", "twice"}},
		{"webhook secret readable by group", with(flagWebhookSecrets, "a="+openSecret), []string{"--cal-diy-webhook-secret-files", "subscription a", "chmod"}},
		{"webhook secret missing", with(flagWebhookSecrets, "a="+filepath.Join(dir, "nope")), []string{"--cal-diy-webhook-secret-files", "subscription a"}},
		{"previous secret of an unknown subscription", with(flagPreviousWebhookSecrets, "nope="+secret2),
			[]string{"--cal-diy-webhook-previous-secret-files", `subscription "nope"`, "--cal-diy-webhook-secret-files does not"}},
		{"previous secret the same", with(flagPreviousWebhookSecrets, testSub+"="+secret),
			[]string{"--cal-diy-webhook-previous-secret-files", "the same secret"}},
		{"previous secret readable by group", with(flagPreviousWebhookSecrets, testSub+"="+openSecret),
			[]string{"--cal-diy-webhook-previous-secret-files", "subscription " + testSub, "chmod"}},
		{"previous entry without file", with(flagPreviousWebhookSecrets, testSub), []string{"--cal-diy-webhook-previous-secret-files", "SUBSCRIPTION_ID=FILE"}},
		{"http subscriber prefix", with(flagSubscriberPrefixes, "http://aip.example.com/hooks/"), []string{"--cal-diy-webhook-subscriber-prefixes", "https"}},
		{"loopback http subscriber prefix", with(flagSubscriberPrefixes, "http://127.0.0.1/hooks/"), []string{"--cal-diy-webhook-subscriber-prefixes", "https"}},
		{"subscriber prefix without /", with(flagSubscriberPrefixes, "https://aip.example.com/hooks"), []string{"--cal-diy-webhook-subscriber-prefixes", "ends with /"}},
		{"subscriber prefix without path", with(flagSubscriberPrefixes, "https://aip.example.com"), []string{"--cal-diy-webhook-subscriber-prefixes", "ends with /"}},
		{"subscriber prefix with query", with(flagSubscriberPrefixes, "https://aip.example.com/hooks/?k=v"), []string{"--cal-diy-webhook-subscriber-prefixes", "query"}},
		{"subscriber prefix with fragment", with(flagSubscriberPrefixes, "https://aip.example.com/hooks/#x"), []string{"--cal-diy-webhook-subscriber-prefixes", "fragment"}},
		{"subscriber prefix with user", with(flagSubscriberPrefixes, "https://u:p@aip.example.com/hooks/"), []string{"--cal-diy-webhook-subscriber-prefixes", "user information"}},
		{"subscriber prefix with escape", with(flagSubscriberPrefixes, "https://aip.example.com/ho%6Fks/"), []string{"--cal-diy-webhook-subscriber-prefixes", "canonical"}},
		{"subscriber prefix with dot segment", with(flagSubscriberPrefixes, "https://aip.example.com/a/../hooks/"), []string{"--cal-diy-webhook-subscriber-prefixes", "dot segments"}},
		{"relative subscriber prefix", with(flagSubscriberPrefixes, "/hooks/"), []string{"--cal-diy-webhook-subscriber-prefixes", "https"}},
		{"empty subscriber prefix entry", with(flagSubscriberPrefixes, "https://aip.example.com/hooks/,,"), []string{"--cal-diy-webhook-subscriber-prefixes", "empty entry"}},
		{"too many subscriber prefixes", with(flagSubscriberPrefixes, strings.Repeat("https://aip.example.com/hooks/,", MaxSubscriberPrefixes)+"https://aip.example.com/x/"),
			[]string{"--cal-diy-webhook-subscriber-prefixes", "lists 33 prefixes, more than 32: list fewer"}},
	}
	for _, tc := range cases {
		_, err := Product.New(tc.values, nil)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if !errors.Is(err, hostsdk.ErrSetting) {
			t.Errorf("%s: error %q does not match hostsdk.ErrSetting (aip-host would exit 1, not 2)", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), testSecret) {
			t.Errorf("%s: the error carries a credential: %v", tc.name, err)
		}
	}
}

// TestSettings: the settings bind as flags and AIP_CAL_DIY_* variables,
// and the response bound is checked.
func TestSettings(t *testing.T) {
	env := map[string]string{
		"AIP_CAL_DIY_BASE_URL":                    "https://api.cal.com",
		"AIP_CAL_DIY_BEARER_TOKEN_FILE":           "/run/secrets/cal",
		"AIP_CAL_DIY_MAX_RESPONSE_BYTES":          "1048576",
		"AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES": "https://aip.example.com/webhooks/cal-diy/",
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	load := hostsdk.BindSettings(fs, Product.Settings)
	if err := fs.Parse([]string{"--cal-diy-base-url", "https://cal.example.com"}); err != nil {
		t.Fatal(err)
	}
	v, err := load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if v[flagBaseURL] != "https://cal.example.com" || v[flagBearerTokenFile] != "/run/secrets/cal" || v.Int(flagMaxResponseBytes) != 1<<20 ||
		v[flagSubscriberPrefixes] != "https://aip.example.com/webhooks/cal-diy/" {
		t.Fatalf("values %v", v)
	}
	for _, bad := range []string{"10", "999999999999", "lots"} {
		env["AIP_CAL_DIY_MAX_RESPONSE_BYTES"] = bad
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		load := hostsdk.BindSettings(fs, Product.Settings)
		fs.Parse(nil)
		if _, err := load(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "cal-diy-max-response-bytes") {
			t.Errorf("max response bytes %q: %v", bad, err)
		}
	}
}

var capabilityIDRE = regexp.MustCompile(`^cap:cal_diy:[a-z]+(_[a-z]+)*(\.[a-z]+(_[a-z]+)*)+$`)

func TestManifest(t *testing.T) {
	c := newConnector(t, "https://api.cal.com", map[string]provider.Secret{testSub: provider.NewSecret(testSecret)}, nil)
	m, err := c.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	bound, digest, err := hostsdk.BindManifest(m, "example.test")
	if err != nil || digest == "" || bound.Agent.TrustDomain != "example.test" {
		t.Fatalf("BindManifest: %v", err)
	}
	raw, _ := json.Marshal(m)
	if strings.Contains(string(raw), testToken) || strings.Contains(string(raw), testSecret) {
		t.Fatal("the manifest carries a credential")
	}
	var got []string
	mutations := map[string]bool{"booking.create": true, "booking.cancel": true, "booking.reschedule": true,
		"booking.confirm": true, "booking.decline": true, "event_type.create": true, "event_type.update": true,
		"event_type.delete": true, "schedule.create": true, "schedule.update": true, "schedule.delete": true,
		"slot.reservation.create": true, "slot.reservation.update": true, "slot.reservation.delete": true,
		"booking.attendee.add": true, "booking.guest.add": true, "booking.mark_absent": true, "booking.reassign": true,
		"booking.location.update": true, "webhook.create": true, "webhook.update": true, "webhook.delete": true,
		"profile.update": true, "booking.reassign_to_user": true, "conferencing.default.set": true, "conferencing.disconnect": true,
		"conferencing.connect":           true,
		"event_type.private_link.create": true, "event_type.private_link.update": true, "event_type.private_link.delete": true,
		"event_type.webhook.create": true, "event_type.webhook.update": true, "event_type.webhook.delete": true,
		"event_type.webhook.delete_all": true, "calendar.disconnect": true, "calendar.destination.update": true,
		"calendar.selected.add": true, "calendar.selected.delete": true, "calendar.event.update": true}
	// Deleting for good is high risk.
	highRisk := map[string]bool{"event_type.delete": true, "schedule.delete": true, "slot.reservation.delete": true,
		"webhook.delete": true, "conferencing.disconnect": true, "event_type.private_link.delete": true,
		"event_type.webhook.delete": true, "event_type.webhook.delete_all": true, "calendar.disconnect": true,
		"calendar.selected.delete": true}
	for _, capa := range m.Capabilities {
		if !capabilityIDRE.MatchString(capa.ID) {
			t.Errorf("capability ID %q does not follow cap:cal_diy:<suffix>", capa.ID)
		}
		suffix := strings.TrimPrefix(capa.ID, CapabilityPrefix)
		got = append(got, suffix)
		if capa.Description == "" || capa.Risk == "" || capa.Contract == nil {
			t.Errorf("%s: description, risk or contract missing", capa.ID)
		}
		if err := capa.Contract.Validate(); err != nil {
			t.Errorf("%s: %v", capa.ID, err)
		}
		if capa.RequiresHumanApproval != nil && *capa.RequiresHumanApproval {
			t.Errorf("%s: requires_human_approval is set, but nothing in this fleet would hold the action for approval", capa.ID)
		}
		if (capa.Risk == aip.RiskHigh) != highRisk[suffix] {
			t.Errorf("%s: risk %s; high exactly when it deletes for good (%v)", capa.ID, capa.Risk, highRisk[suffix])
		}
		// The table itself: whatever is not a GET is a mutation, and a
		// DELETE is high risk.
		if o := operationsByID[capa.ID]; o.Method != http.MethodGet && !o.Mutation || o.Method == http.MethodDelete && o.Risk != aip.RiskHigh {
			t.Errorf("%s: %s with mutation %v and risk %s; a non-GET is a mutation and a DELETE is high risk", capa.ID, o.Method, o.Mutation, o.Risk)
		}
		if writes := slices.Contains(capa.Contract.SideEffects, "write"); writes != mutations[suffix] {
			t.Errorf("%s: side effects %v; a write exactly when it is a mutation (%v)", capa.ID, capa.Contract.SideEffects, mutations[suffix])
		}
		var schema map[string]any
		if err := json.Unmarshal(capa.InputSchema, &schema); err != nil {
			t.Fatalf("%s: %v", capa.ID, err)
		}
		if _, ok := schema["required"]; !ok {
			t.Errorf("%s: input schema has no required list", capa.ID)
		}
		checkStrict(t, capa.ID, schema)
	}
	want := []string{"profile.get", "event_type.list", "event_type.get", "slot.list", "booking.list", "booking.get",
		"booking.create", "booking.cancel", "booking.reschedule", "booking.confirm", "booking.decline", "schedule.list",
		"event_type.create", "event_type.update", "event_type.delete",
		"schedule.default.get", "schedule.get", "schedule.create", "schedule.update", "schedule.delete",
		"slot.reservation.create", "slot.reservation.get", "slot.reservation.update", "slot.reservation.delete",
		"booking.attendee.list", "booking.attendee.add", "booking.attendee.get", "booking.guest.add",
		"booking.mark_absent", "booking.reassign", "booking.location.update", "booking.get_by_seat",
		"booking.calendar_links.get", "booking.reference.list", "booking.recording.list", "booking.transcript.list",
		"calendar.list", "calendar.busy_time.list", "conferencing.list", "conferencing.default.get",
		"webhook.list", "webhook.get", "webhook.create", "webhook.update", "webhook.delete",
		"booking.reassign_to_user", "booking.conferencing_session.list", "conferencing.default.set", "conferencing.connect", "conferencing.disconnect",
		"event_type.private_link.list", "event_type.private_link.create", "event_type.private_link.update", "event_type.private_link.delete",
		"event_type.webhook.list", "event_type.webhook.get", "event_type.webhook.create", "event_type.webhook.update",
		"event_type.webhook.delete", "event_type.webhook.delete_all",
		"calendar.provider.check", "calendar.disconnect", "calendar.ics_feed.check", "calendar.destination.update",
		"calendar.selected.add", "calendar.selected.delete", "calendar.event.update", "profile.update"}
	if !slices.Equal(got, want) {
		t.Errorf("capabilities %v, want %v", got, want)
	}
	if len(m.Channels) != 1 || !strings.Contains(string(m.Channels[0]), `"id":"cal-diy-webhooks"`) {
		t.Errorf("channels %s, want cal-diy-webhooks", m.Channels)
	}
}

// checkStrict requires closed objects and bounded strings, numbers and
// arrays throughout a schema.
func checkStrict(t *testing.T, where string, s map[string]any) {
	t.Helper()
	if alts, ok := s["oneOf"].([]any); ok {
		// Alternatives: each must be strict on its own.
		for i, a := range alts {
			checkStrict(t, fmt.Sprintf("%s|%d", where, i), a.(map[string]any))
		}
	}
	switch s["type"] {
	case "object":
		if props, ok := s["properties"].(map[string]any); ok {
			if s["additionalProperties"] != false {
				t.Errorf("%s: object without additionalProperties false", where)
			}
			for k, p := range props {
				checkStrict(t, where+"."+k, p.(map[string]any))
			}
		} else if s["maxProperties"] == nil {
			t.Errorf("%s: open object without maxProperties", where)
		}
	case "string":
		if s["maxLength"] == nil && s["enum"] == nil {
			t.Errorf("%s: string without maxLength", where)
		}
	case "integer", "number":
		if s["minimum"] == nil || s["maximum"] == nil {
			t.Errorf("%s: number without bounds", where)
		}
	case "array":
		if s["maxItems"] == nil {
			t.Errorf("%s: array without maxItems", where)
		}
		checkStrict(t, where+"[]", s["items"].(map[string]any))
	case "boolean":
	default:
		t.Errorf("%s: schema without a type: %v", where, s)
	}
}

// TestOperationsMatchDocument: every operation is in the published
// document with its method, and sends the cal-api-version the document
// requires for it (none where the document has no such parameter); the
// operations whose document lists a required body send one.
func TestOperationsMatchDocument(t *testing.T) {
	raw, err := os.ReadFile("../internal/spectest/specs/cal-diy/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name        string `json:"name"`
				In          string `json:"in"`
				Required    bool   `json:"required"`
				Description string `json:"description"`
				Schema      struct {
					Default any `json:"default"`
				} `json:"schema"`
			} `json:"parameters"`
			RequestBody *struct {
				Required bool `json:"required"`
			} `json:"requestBody"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	rename := strings.NewReplacer("{event_type_id}", "{eventTypeId}", "{booking_uid}", "{bookingUid}",
		"{schedule_id}", "{scheduleId}", "{reservation_uid}", "{uid}", "{attendee_id}", "{attendeeId}",
		"{seat_uid}", "{seatUid}", "{webhook_id}", "{webhookId}", "{user_id}", "{userId}", "{link_id}", "{linkId}",
		"{event_uid}", "{eventUid}")
	// Some operations give the required version only in the header's
	// description ("Must be set to 2024-08-13. ...").
	mustBeSet := regexp.MustCompile(`^Must be set to (\d{4}-\d{2}-\d{2})\.`)
	for _, o := range operations {
		tmpl := rename.Replace(o.Path)
		op, ok := doc.Paths[tmpl][strings.ToLower(o.Method)]
		if !ok {
			t.Errorf("%s: %s %s is not in the document", o.ID(), o.Method, tmpl)
			continue
		}
		want := ""
		for _, p := range op.Parameters {
			if p.In == "header" && p.Name == "cal-api-version" {
				want, _ = p.Schema.Default.(string)
				if m := mustBeSet.FindStringSubmatch(p.Description); want == "" && m != nil {
					want = m[1]
				}
				if want == "" {
					t.Errorf("%s: the document's cal-api-version has neither a default nor a required value", o.ID())
				}
			}
		}
		if o.Version != want {
			t.Errorf("%s: cal-api-version %q, the document requires %q", o.ID(), o.Version, want)
		}
		if op.RequestBody != nil && op.RequestBody.Required && o.Body == nil && !o.AlwaysBody {
			t.Errorf("%s: the document requires a body", o.ID())
		}
	}
}

// TestNewErrorsStartWithTheSetting: New's errors started with "calcom: ",
// so aip-host printed "aip-host: cal-diy: calcom: --cal-diy-..."; they
// start with what to fix, as the settings' own errors do.
func TestNewErrorsStartWithTheSetting(t *testing.T) {
	base, _ := provider.ParseBaseURL("base", "https://api.cal.com", false, false)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no base URL; set --" + flagBaseURL},
		{Config{BaseURL: base, Token: provider.NewSecret("cal_x"), SubscriberPrefixes: []string{"http://aip.example.com/hooks/"}},
			"--" + flagSubscriberPrefixes + ` (AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES): prefix "http://aip.example.com/hooks/" must be an https URL`},
	} {
		if _, err := New(c.cfg); err == nil || err.Error() != c.want {
			t.Errorf("New: %v; want %s", err, c.want)
		}
	}
}
