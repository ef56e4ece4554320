package twenty

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Setting flags (each with its AIP_TWENTY_* variable).
const (
	FlagBaseURL           = "twenty-base-url"
	FlagWorkspaceID       = "twenty-workspace-id"
	FlagAPITokenFile      = "twenty-api-token-file"
	FlagWebhookSecretFile = "twenty-webhook-secret-file"
	// FlagPreviousWebhookSecretFile holds the secret being replaced
	// while Twenty switches to the one of FlagWebhookSecretFile.
	FlagPreviousWebhookSecretFile = "twenty-webhook-previous-secret-file"
	FlagAllowInsecureHTTP         = "twenty-allow-insecure-http"
	FlagMaxResponseBytes          = "twenty-max-response-bytes"
	FlagObjects                   = "twenty-objects"
	FlagOperationsFile            = "twenty-operations-file"
)

// Bounds and defaults.
const (
	// DefaultMaxResponseBytes, MinMaxResponseBytes and MaxMaxResponseBytes
	// bound --twenty-max-response-bytes (reference: default 64 MiB, at
	// most 256 MiB).
	DefaultMaxResponseBytes = 64 << 20
	MinMaxResponseBytes     = 1 << 10
	MaxMaxResponseBytes     = 256 << 20
	// Timeout bounds one Twenty request (reference: 120 s in total).
	Timeout = 120 * time.Second
	// DefaultObjects is --twenty-objects when it is not given.
	DefaultObjects = "people,companies,opportunities,notes,tasks"
	// MaxObjects bounds --twenty-objects.
	MaxObjects = 128
	// MaxOperationsFileBytes bounds --twenty-operations-file (reference:
	// at most 128 KiB).
	MaxOperationsFileBytes = 128 << 10
)

// objectNamePattern is a Twenty object's plural API name as the adapter
// accepts it: it becomes a path segment of /rest/<objectNamePlural>.
var objectNamePattern = regexp.MustCompile(`^[a-z][A-Za-z0-9]{0,62}$`)

// uuidPattern is an RFC 4122 UUID of version 1 to 5 (variant 10xx).
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-5][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$`)

// Product is the Twenty adapter as cmd/aip-host runs it.
var Product = products.Product{
	Name:    "twenty",
	Summary: "Twenty CRM records over its workspace REST API (list, get, duplicates, group by, create, update, soft delete, restore, merge, filter-form batches, opt-in permanent deletes and policy-bound idempotent ingest, object and field metadata, the generated OpenAPI documents) and its signed webhooks",
	Settings: []hostsdk.Setting{
		{Flag: FlagBaseURL, Env: "AIP_TWENTY_BASE_URL",
			Usage: "Twenty server origin, e.g. https://api.twenty.com (required; https, or http to loopback)"},
		{Flag: FlagWorkspaceID, Env: "AIP_TWENTY_WORKSPACE_ID",
			Usage: "the workspace's ID, an RFC 4122 UUID v1-v5 (required)"},
		{Flag: FlagAPITokenFile, Env: "AIP_TWENTY_API_TOKEN_FILE",
			Usage: "owner-only file holding the workspace API key, sent as a Bearer token (required)"},
		{Flag: FlagWebhookSecretFile, Env: "AIP_TWENTY_WEBHOOK_SECRET_FILE",
			Usage: "owner-only file holding the webhook signing secret; when set, POST /webhooks/twenty is served"},
		{Flag: FlagPreviousWebhookSecretFile, Env: "AIP_TWENTY_WEBHOOK_PREVIOUS_SECRET_FILE",
			Usage: "owner-only file holding the webhook secret being replaced, also accepted while Twenty switches to the one of --" + FlagWebhookSecretFile + "; remove it once the switch is done"},
		{Flag: FlagAllowInsecureHTTP, Env: "AIP_TWENTY_ALLOW_INSECURE_HTTP", Kind: hostsdk.SettingBool,
			Usage: "accept a plain http base URL on a private network (host name or private IP address; never a public IP address)"},
		{Flag: FlagMaxResponseBytes, Env: "AIP_TWENTY_MAX_RESPONSE_BYTES", Kind: hostsdk.SettingInt,
			Min: MinMaxResponseBytes, Max: MaxMaxResponseBytes,
			Usage: fmt.Sprintf("largest Twenty answer read, in bytes (default %d)", DefaultMaxResponseBytes)},
		{Flag: FlagObjects, Env: "AIP_TWENTY_OBJECTS",
			Usage: "comma-separated plural API names of the objects the capabilities accept (default " + DefaultObjects + ")"},
		{Flag: FlagOperationsFile, Env: "AIP_TWENTY_OPERATIONS_FILE",
			Usage: `JSON file (not writable by group or others, at most 128 KiB) holding the array of operations to offer, e.g. ["record.list","record.destroy"]; default: every operation except the permanent deletes record.destroy and record.destroy_many, record.merge (it deletes the merged-away records) and the ingests record.ingest and record.ingest_many`},
		{Flag: FlagIngestPolicyFile, Env: "AIP_TWENTY_IDEMPOTENT_INGEST_POLICY_FILE",
			Usage: "JSON file (not writable by group or others, at most 1 MiB) holding the idempotent ingest policy (" + IngestPolicyVersion + "): the objects and fields record.ingest and record.ingest_many may write; required when those are listed"},
	},
	New: provider.FromSettings(newFromSettings),
}

// Config is a Twenty connector's configuration.
type Config struct {
	// BaseURL is the Twenty server, checked with provider.ParseBaseURL.
	BaseURL *url.URL
	// WorkspaceID is the workspace the API key belongs to (lowercase UUID).
	WorkspaceID string
	// Token is the workspace API key.
	Token provider.Secret
	// WebhookSecret is the webhook signing secret; empty: no webhook
	// route.
	WebhookSecret provider.Secret
	// PreviousWebhookSecret, when not empty, verifies deliveries too:
	// the secret being replaced, while Twenty switches to WebhookSecret.
	// It needs WebhookSecret.
	PreviousWebhookSecret provider.Secret
	// MaxResponseBytes bounds an answer. Defaults to
	// DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// Objects are the plural object names the capabilities accept, in
	// order. Defaults to DefaultObjects.
	Objects []string
	// Operations are the operations offered (capability ID suffixes). nil
	// offers DefaultOperations.
	Operations []string
	// IngestPolicy is the idempotent ingest policy; record.ingest and
	// record.ingest_many need it. nil: none.
	IngestPolicy *IngestPolicy
	// Transport is the HTTP round tripper (nil: the default).
	Transport http.RoundTripper
	// Now is the clock of webhook timestamp checks. Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to a logger that discards everything.
	Logger *slog.Logger
}

func newFromSettings(v hostsdk.SettingValues, logger *slog.Logger) (hostsdk.Connector, error) {
	cfg := Config{Logger: logger, MaxResponseBytes: v.Int(FlagMaxResponseBytes)}
	base, err := ParseBaseURL(v[FlagBaseURL], v.Bool(FlagAllowInsecureHTTP))
	if err != nil {
		return nil, err
	}
	cfg.BaseURL = base
	cfg.WorkspaceID = v[FlagWorkspaceID]
	if cfg.WorkspaceID == "" {
		return nil, fmt.Errorf("--%s (AIP_TWENTY_WORKSPACE_ID): no workspace ID given; set it to the workspace's UUID", FlagWorkspaceID)
	}
	if cfg.Token, err = provider.ReadSecret("--"+FlagAPITokenFile+" (AIP_TWENTY_API_TOKEN_FILE)", v[FlagAPITokenFile], logger); err != nil {
		return nil, err
	}
	if f := v[FlagWebhookSecretFile]; f != "" {
		if cfg.WebhookSecret, err = provider.ReadSecret("--"+FlagWebhookSecretFile+" (AIP_TWENTY_WEBHOOK_SECRET_FILE)", f, logger); err != nil {
			return nil, err
		}
	}
	if f := v[FlagPreviousWebhookSecretFile]; f != "" {
		if cfg.PreviousWebhookSecret, err = provider.ReadSecret("--"+FlagPreviousWebhookSecretFile+" (AIP_TWENTY_WEBHOOK_PREVIOUS_SECRET_FILE)", f, logger); err != nil {
			return nil, err
		}
	}
	if s, ok := v[FlagObjects]; ok {
		if cfg.Objects, err = ParseObjects(s); err != nil {
			return nil, err
		}
	}
	if f := v[FlagOperationsFile]; f != "" {
		if cfg.Operations, err = ReadOperationsFile(f); err != nil {
			return nil, err
		}
	}
	if f := v[FlagIngestPolicyFile]; f != "" {
		if cfg.IngestPolicy, err = ReadIngestPolicyFile(f); err != nil {
			return nil, err
		}
	}
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ReadOperationsFile reads --twenty-operations-file: a JSON array of 1 to
// len(operations) distinct operation names (the part of a capability ID
// after cap:twenty:), in a file not writable by group or others.
func ReadOperationsFile(path string) ([]string, error) {
	what := "--" + FlagOperationsFile + " (AIP_TWENTY_OPERATIONS_FILE)"
	ops, err := provider.ReadJSONList[string](what, path, MaxOperationsFileBytes, len(operations),
		`operation names (e.g. ["record.list","record.destroy"])`)
	if err != nil {
		return nil, err
	}
	if _, err := admit(ops); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", what, path, err)
	}
	return ops, nil
}

// DefaultOperations are the operations offered without
// --twenty-operations-file: every operation but the destructive ones (the
// permanent deletes and merge) and the ingests.
func DefaultOperations() []string {
	var out []string
	for _, o := range operations {
		if !o.destructive && !o.ingest {
			out = append(out, o.op)
		}
	}
	return out
}

// admit checks an operations list and returns the set it admits; nil
// admits DefaultOperations.
func admit(ops []string) (map[string]bool, error) {
	if ops == nil {
		ops = DefaultOperations()
	}
	if len(ops) == 0 {
		return nil, errors.New("the operations list is empty; list the operations to offer, or leave the setting out to offer every non-destructive one")
	}
	out := map[string]bool{}
	for _, op := range ops {
		if !slices.ContainsFunc(operations, func(o operation) bool { return o.op == op }) {
			return nil, fmt.Errorf("unknown operation %q; the operations are %s", op, strings.Join(allOperations(), ", "))
		}
		if out[op] {
			return nil, fmt.Errorf("operation %q is listed twice", op)
		}
		out[op] = true
	}
	return out, nil
}

func allOperations() []string {
	out := make([]string, len(operations))
	for i, o := range operations {
		out[i] = o.op
	}
	return out
}

// ParseBaseURL checks --twenty-base-url: an origin (a path is accepted for
// a server behind a reverse proxy), https, or plain http to loopback. With
// allowInsecure, plain http is also accepted to a host name or a private
// IP address; a public IP address literal over http is still refused.
func ParseBaseURL(raw string, allowInsecure bool) (*url.URL, error) {
	what := "--" + FlagBaseURL + " (AIP_TWENTY_BASE_URL)"
	u, err := provider.ParseBaseURL(what, raw, true, allowInsecure)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "http" && !provider.IsLoopback(u.Hostname()) {
		if ip := net.ParseIP(u.Hostname()); ip != nil && !ip.IsPrivate() && !ip.IsLinkLocalUnicast() {
			return nil, fmt.Errorf("%s: %q uses plain http to a public IP address; --%s covers private networks only, use https", what, raw, FlagAllowInsecureHTTP)
		}
	}
	return u, nil
}

// ParseObjects parses --twenty-objects: a comma-separated list of 1 to
// MaxObjects distinct plural object names ([a-z][A-Za-z0-9]{0,62}).
func ParseObjects(s string) ([]string, error) {
	what := "--" + FlagObjects + " (AIP_TWENTY_OBJECTS)"
	var out []string
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		name := strings.TrimSpace(part)
		if !objectNamePattern.MatchString(name) {
			return nil, fmt.Errorf("%s: %q is not a plural object API name; want a lowercase letter then up to 62 letters or digits (e.g. people, companies, myCustomObjects)", what, name)
		}
		if name == "batch" || name == "metadata" || name == "restore" {
			return nil, fmt.Errorf("%s: %q is a reserved REST path segment of Twenty, not an object name", what, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("%s: %q is listed twice", what, name)
		}
		seen[name] = true
		out = append(out, name)
	}
	if len(out) > MaxObjects {
		return nil, fmt.Errorf("%s: %d objects; at most %d", what, len(out), MaxObjects)
	}
	return out, nil
}

// validate checks cfg and fills in the defaults.
func (cfg *Config) validate() error {
	if cfg.BaseURL == nil {
		return errors.New("no base URL; set --" + FlagBaseURL)
	}
	if !uuidPattern.MatchString(cfg.WorkspaceID) {
		return fmt.Errorf("--%s (AIP_TWENTY_WORKSPACE_ID): %q is not an RFC 4122 UUID of version 1 to 5; copy the workspace ID from Twenty's settings", FlagWorkspaceID, cfg.WorkspaceID)
	}
	cfg.WorkspaceID = strings.ToLower(cfg.WorkspaceID)
	if cfg.Token.Empty() {
		return fmt.Errorf("--%s (AIP_TWENTY_API_TOKEN_FILE): no API key; give the file holding the workspace API key", FlagAPITokenFile)
	}
	switch {
	case cfg.PreviousWebhookSecret.Empty():
	case cfg.WebhookSecret.Empty():
		return fmt.Errorf("--%s (AIP_TWENTY_WEBHOOK_PREVIOUS_SECRET_FILE) is set without --%s: give the new secret as --%s and the one it replaces as --%s",
			FlagPreviousWebhookSecretFile, FlagWebhookSecretFile, FlagWebhookSecretFile, FlagPreviousWebhookSecretFile)
	case cfg.PreviousWebhookSecret.Reveal() == cfg.WebhookSecret.Reveal():
		return fmt.Errorf("--%s (AIP_TWENTY_WEBHOOK_PREVIOUS_SECRET_FILE) holds the same secret as --%s: give it the secret being replaced, or leave it out",
			FlagPreviousWebhookSecretFile, FlagWebhookSecretFile)
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxResponseBytes < MinMaxResponseBytes || cfg.MaxResponseBytes > MaxMaxResponseBytes {
		return fmt.Errorf("--%s (AIP_TWENTY_MAX_RESPONSE_BYTES): %d is outside %d to %d", FlagMaxResponseBytes, cfg.MaxResponseBytes, MinMaxResponseBytes, MaxMaxResponseBytes)
	}
	if len(cfg.Objects) == 0 {
		objs, err := ParseObjects(DefaultObjects)
		if err != nil {
			return err
		}
		cfg.Objects = objs
	} else if _, err := ParseObjects(strings.Join(cfg.Objects, ",")); err != nil {
		return err
	}
	admitted, err := admit(cfg.Operations)
	if err != nil {
		return fmt.Errorf("--%s (AIP_TWENTY_OPERATIONS_FILE): %w", FlagOperationsFile, err)
	}
	if cfg.IngestPolicy != nil {
		if err := cfg.IngestPolicy.check(cfg.Objects); err != nil {
			return fmt.Errorf("--%s (AIP_TWENTY_IDEMPOTENT_INGEST_POLICY_FILE): %w", FlagIngestPolicyFile, err)
		}
	} else if admitted[OpIngest] || admitted[OpIngestMany] {
		return fmt.Errorf("--%s (AIP_TWENTY_OPERATIONS_FILE) lists record.ingest or record.ingest_many, which need an ingest policy: set --%s (AIP_TWENTY_IDEMPOTENT_INGEST_POLICY_FILE)", FlagOperationsFile, FlagIngestPolicyFile)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
