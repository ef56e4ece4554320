package chatwoot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Identifiers the reference (§8.3) gives.
const (
	// Profile is the connector profile in the manifest.
	Profile = "aip.connector.chatwoot.v1"
	// WebhookProfile is added to the manifest's profiles when webhook
	// ingress is configured.
	WebhookProfile = "aip.connector.chatwoot.webhook.v1"
	// Channel is the event channel of webhook deliveries.
	Channel = "chatwoot-webhooks"
	// WebhookPath is the route mounted when a webhook secret is set.
	WebhookPath = "/webhooks/chatwoot"
	// ActionIDAttribute is the content_attributes key in which the
	// connector records the AIP action that created a message; webhook
	// deliveries of such messages are dropped (loop prevention).
	ActionIDAttribute = "aip_action_id"
)

// Limits.
const (
	DefaultMaxResponseBytes = 16 << 20
	MaxMaxResponseBytes     = 128 << 20
	// MaxOperationsFileBytes bounds the operations file.
	MaxOperationsFileBytes = 128 << 10
	// Timeout bounds one provider request.
	Timeout = 120 * time.Second
)

// Setting flags.
const (
	flagBaseURL       = "chatwoot-base-url"
	flagAccountID     = "chatwoot-account-id"
	flagTokenFile     = "chatwoot-api-token-file"
	flagWebhookSecret = "chatwoot-webhook-secret-file"
	// flagPreviousWebhookSecret holds the secret being replaced while
	// Chatwoot switches to the one of flagWebhookSecret.
	flagPreviousWebhookSecret = "chatwoot-webhook-previous-secret-file"
	flagMaxResponseBytes      = "chatwoot-max-response-bytes"
	flagOperationsFile        = "chatwoot-operations-file"
)

// Product is Chatwoot as cmd/aip-host runs it.
var Product = products.Product{
	Name:    "chatwoot",
	Summary: "Chatwoot application API (conversations, messages, contacts, canned responses, inboxes, teams, labels) and signed webhooks",
	Settings: []hostsdk.Setting{
		{Flag: flagBaseURL, Env: "AIP_CHATWOOT_BASE_URL",
			Usage: "Chatwoot origin, e.g. https://chat.example.com (scheme, host and port only; http only for loopback)"},
		{Flag: flagAccountID, Env: "AIP_CHATWOOT_ACCOUNT_ID", Kind: hostsdk.SettingInt, Min: 1, Max: 1<<53 - 1,
			Usage: "numeric Chatwoot account ID the connector acts in"},
		{Flag: flagTokenFile, Env: "AIP_CHATWOOT_API_TOKEN_FILE",
			Usage: "owner-only file holding the Chatwoot api_access_token"},
		{Flag: flagWebhookSecret, Env: "AIP_CHATWOOT_WEBHOOK_SECRET_FILE",
			Usage: "owner-only file holding the webhook signing secret; omit for an outbound-only host without POST " + WebhookPath},
		{Flag: flagPreviousWebhookSecret, Env: "AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE",
			Usage: "owner-only file holding the webhook secret being replaced, also accepted while Chatwoot switches to the one of --" + flagWebhookSecret + "; remove it once the switch is done"},
		{Flag: flagMaxResponseBytes, Env: "AIP_CHATWOOT_MAX_RESPONSE_BYTES", Kind: hostsdk.SettingInt, Min: 1024, Max: MaxMaxResponseBytes,
			Usage: "largest Chatwoot response read, in bytes (default 16 MiB)"},
		{Flag: flagOperationsFile, Env: "AIP_CHATWOOT_OPERATIONS_FILE",
			Usage: "optional JSON array of catalogue operation suffixes to admit (default: all but agent.create, agent.update and agent.delete, which must be listed)"},
	},
	New: provider.FromSettings(newFromSettings),
}

func newFromSettings(v hostsdk.SettingValues, logger *slog.Logger) (hostsdk.Connector, error) {
	var cfg Config
	var err error
	if cfg.BaseURL, err = provider.ParseBaseURL("--"+flagBaseURL+" (AIP_CHATWOOT_BASE_URL)", v[flagBaseURL], false, false); err != nil {
		return nil, err
	}
	if v[flagAccountID] == "" {
		return nil, fmt.Errorf("--%s (AIP_CHATWOOT_ACCOUNT_ID): no account ID given; set the numeric ID of the Chatwoot account", flagAccountID)
	}
	cfg.AccountID = v.Int(flagAccountID)
	if v[flagTokenFile] == "" {
		return nil, fmt.Errorf("--%s (AIP_CHATWOOT_API_TOKEN_FILE): no file given; point it at an owner-only file holding the api_access_token", flagTokenFile)
	}
	if cfg.Token, err = provider.ReadSecret("--"+flagTokenFile+" (AIP_CHATWOOT_API_TOKEN_FILE)", v[flagTokenFile], logger); err != nil {
		return nil, err
	}
	if p := v[flagWebhookSecret]; p != "" {
		if cfg.WebhookSecret, err = provider.ReadSecret("--"+flagWebhookSecret+" (AIP_CHATWOOT_WEBHOOK_SECRET_FILE)", p, logger); err != nil {
			return nil, err
		}
	}
	if p := v[flagPreviousWebhookSecret]; p != "" {
		if cfg.PreviousWebhookSecret, err = provider.ReadSecret("--"+flagPreviousWebhookSecret+" (AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE)", p, logger); err != nil {
			return nil, err
		}
	}
	cfg.MaxResponseBytes = v.Int(flagMaxResponseBytes)
	if p := v[flagOperationsFile]; p != "" {
		if cfg.Operations, err = ReadOperationsFile(p); err != nil {
			return nil, err
		}
	}
	cfg.Logger = logger
	return New(cfg)
}

// ReadOperationsFile reads the --chatwoot-operations-file: a JSON array of
// catalogue suffixes, not writable by group or others.
func ReadOperationsFile(path string) ([]string, error) {
	what := "--" + flagOperationsFile + " (AIP_CHATWOOT_OPERATIONS_FILE)"
	ops, err := provider.ReadJSONList[string](what, path, MaxOperationsFileBytes, 1024,
		`operation suffixes (e.g. ["conversation.list"])`)
	if err != nil {
		return nil, err
	}
	if _, err := checkOperations(ops); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", what, path, err)
	}
	return ops, nil
}

// checkOperations returns the admitted catalogue operations in catalogue
// order. ops nil admits all but the opt-in ones (account administration:
// agent.create, agent.update, agent.delete), which only a list admits.
func checkOperations(ops []string) ([]*operation, error) {
	if ops == nil {
		var out []*operation
		for i := range catalogue {
			if !catalogue[i].OptIn {
				out = append(out, &catalogue[i])
			}
		}
		return out, nil
	}
	if len(ops) == 0 {
		return nil, errors.New("the operations list is empty; list the operations to admit or leave the setting out to admit all")
	}
	want := map[string]bool{}
	for _, s := range ops {
		if op := lookupOperation(s); op == nil {
			return nil, fmt.Errorf("unknown operation %q; valid operations are %s", s, strings.Join(operationSuffixes(), ", "))
		}
		if want[s] {
			return nil, fmt.Errorf("operation %q is listed twice", s)
		}
		want[s] = true
	}
	var out []*operation
	for i := range catalogue {
		if want[catalogue[i].Suffix] {
			out = append(out, &catalogue[i])
		}
	}
	return out, nil
}

// Config configures a Connector.
type Config struct {
	// BaseURL is the Chatwoot origin (checked with provider.ParseBaseURL).
	BaseURL *url.URL
	// AccountID is the account every call is made in.
	AccountID int64
	// Token is the api_access_token.
	Token provider.Secret
	// WebhookSecret signs webhook deliveries; empty means no webhook route.
	WebhookSecret provider.Secret
	// PreviousWebhookSecret, when not empty, verifies deliveries too:
	// the secret being replaced, while Chatwoot switches to
	// WebhookSecret. It needs WebhookSecret.
	PreviousWebhookSecret provider.Secret
	// MaxResponseBytes bounds a response (0: DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// Operations are the catalogue suffixes admitted (nil: all but the
	// opt-in agent administration operations).
	Operations []string
	// Logger defaults to a logger that discards everything.
	Logger *slog.Logger
	// Now is the clock for webhook timestamps. Defaults to time.Now.
	Now func() time.Time
	// Transport is the provider round tripper (nil: the default).
	Transport http.RoundTripper
}

// Connector is the Chatwoot connector.
type Connector struct {
	cfg    Config
	client *provider.Client
	ops    []*operation
	// base is the account's API path, /api/v1/accounts/<id>.
	base string
}

// New validates cfg and returns the connector.
func New(cfg Config) (*Connector, error) {
	if cfg.BaseURL == nil {
		return nil, fmt.Errorf("--%s: no base URL given", flagBaseURL)
	}
	if cfg.BaseURL.Path != "" {
		return nil, fmt.Errorf("--%s: %q has a path; give the origin alone", flagBaseURL, cfg.BaseURL.String())
	}
	if cfg.AccountID < 1 {
		return nil, fmt.Errorf("--%s: account ID %d; want a positive integer", flagAccountID, cfg.AccountID)
	}
	if cfg.Token.Empty() {
		return nil, fmt.Errorf("--%s: no API token; point it at an owner-only file holding the api_access_token", flagTokenFile)
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxResponseBytes < 1024 || cfg.MaxResponseBytes > MaxMaxResponseBytes {
		return nil, fmt.Errorf("--%s: %d; want 1024 to %d bytes", flagMaxResponseBytes, cfg.MaxResponseBytes, MaxMaxResponseBytes)
	}
	switch {
	case cfg.PreviousWebhookSecret.Empty():
	case cfg.WebhookSecret.Empty():
		return nil, fmt.Errorf("--%s is set without --%s: give the new secret as --%s and the one it replaces as --%s",
			flagPreviousWebhookSecret, flagWebhookSecret, flagWebhookSecret, flagPreviousWebhookSecret)
	case cfg.PreviousWebhookSecret.Reveal() == cfg.WebhookSecret.Reveal():
		return nil, fmt.Errorf("--%s holds the same secret as --%s: give it the secret being replaced, or leave it out", flagPreviousWebhookSecret, flagWebhookSecret)
	}
	ops, err := checkOperations(cfg.Operations)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagOperationsFile, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	token := cfg.Token
	client, err := provider.New(provider.Config{
		Product: "chatwoot", BaseURL: cfg.BaseURL, MaxResponseBytes: cfg.MaxResponseBytes,
		Timeout: Timeout, UserAgent: "aipfleet-chatwoot/1", Transport: cfg.Transport,
		Auth:    func(r *http.Request) { r.Header.Set("api_access_token", token.Reveal()) },
		Secrets: []provider.Secret{token},
	})
	if err != nil {
		return nil, err
	}
	return &Connector{cfg: cfg, client: client, ops: ops,
		base: "/api/v1/accounts/" + strconv.FormatInt(cfg.AccountID, 10)}, nil
}

// AgentID is the connector's agent principal for an account.
func AgentID(accountID int64) string { return "agent:chatwoot:" + strconv.FormatInt(accountID, 10) }

// Manifest implements hostsdk.Connector.
func (c *Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	caps := make([]aip.Capability, 0, len(composites)+len(c.ops))
	for _, op := range composites {
		caps = append(caps, op.capability())
	}
	for _, op := range c.ops {
		caps = append(caps, op.capability())
	}
	m := &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent: aip.Principal{ID: AgentID(c.cfg.AccountID), Kind: aip.PrincipalAgent,
			DisplayName: "Chatwoot account " + strconv.FormatInt(c.cfg.AccountID, 10)},
		Profiles:     []string{aip.NativeHTTPProfile, Profile},
		Capabilities: caps,
	}
	compat := map[string]any{
		"catalog_operations_supported": len(catalogue),
		"catalog_operations_admitted":  len(c.ops),
		"composite_operations":         len(composites),
	}
	security := map[string]any{
		"api_auth":                        []string{"api_access_token"},
		"credential_material_in_protocol": false,
		"provider_idempotency":            false,
	}
	if c.webhooks() {
		m.Profiles = append(m.Profiles, WebhookProfile)
		ch, err := json.Marshal(map[string]any{"id": Channel, "system": "chatwoot", "account_id": c.cfg.AccountID})
		if err != nil {
			return nil, err
		}
		m.Channels = []json.RawMessage{ch}
		security["webhook_hmac"] = "sha256_hex_timestamp_dot_raw_body"
	}
	var err error
	if m.Compatibility, err = json.Marshal(compat); err != nil {
		return nil, err
	}
	if m.Security, err = json.Marshal(security); err != nil {
		return nil, err
	}
	return m, nil
}

func (c *Connector) webhooks() bool { return !c.cfg.WebhookSecret.Empty() }

// CheckHealth implements hostsdk.HealthChecker: an authenticated read of
// the account (GET /api/v1/accounts/{account_id}).
func (c *Connector) CheckHealth(ctx context.Context) error {
	if err := c.client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: c.base}, nil); err != nil {
		return fmt.Errorf("chatwoot health: %w", err)
	}
	return nil
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	id := call.Action.CapabilityID
	for _, op := range composites {
		if op.id() == id {
			return op.run(ctx, c, call)
		}
	}
	for _, op := range c.ops {
		if op.id() == id {
			return c.runCatalogue(ctx, op, call)
		}
	}
	return nil, aip.NewProtocolError("chatwoot.unknown_capability", aip.CategoryPermanent, false, 0,
		fmt.Sprintf("capability %q is not offered by this connector", id))
}

// decodeInput decodes an action's input strictly into v, integers
// spelled as other numbers (42.0, 4.2e1: the schema's "integer" accepts
// them) read as the integers they are (provider.IntegralNumbers), so that
// an ID is never sent as "42.0" nor read by Chatwoot as another number.
// An input holding the character U+0000 is refused (provider.RefuseNUL):
// Chatwoot keeps its text in PostgreSQL, which cannot store it, and
// answers such a request with a 500 that a mutation could only report as
// outcome_unknown.
func decodeInput(call *hostsdk.Call, v any) error {
	if err := provider.RefuseNUL("chatwoot.input_invalid", "Chatwoot", call); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(provider.IntegralNumbers(call.Action.Input)))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return aip.NewProtocolError("chatwoot.input_invalid", aip.CategoryPermanent, false, 0,
			fmt.Sprintf("input of %s: %v", call.Action.CapabilityID, err))
	}
	return nil
}

func operationSuffixes() []string {
	out := make([]string, len(catalogue))
	for i := range catalogue {
		out[i] = catalogue[i].Suffix
	}
	slices.Sort(out)
	return out
}

var (
	_ hostsdk.Connector     = (*Connector)(nil)
	_ hostsdk.HealthChecker = (*Connector)(nil)
	_ hostsdk.RouteProvider = (*Connector)(nil)
)
