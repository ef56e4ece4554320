package calcom

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Setting flags (each also read from its AIP_CAL_DIY_* variable).
const (
	flagBaseURL          = "cal-diy-base-url"
	flagBearerTokenFile  = "cal-diy-bearer-token-file"
	flagMaxResponseBytes = "cal-diy-max-response-bytes"
	flagWebhookSecrets   = "cal-diy-webhook-secret-files"
	// flagPreviousWebhookSecrets holds, for some of the subscriptions of
	// flagWebhookSecrets, the secret being replaced while Cal.diy
	// switches to the new one.
	flagPreviousWebhookSecrets = "cal-diy-webhook-previous-secret-files"
	// flagSubscriberPrefixes lists the HTTPS URL prefixes webhook.create
	// and webhook.update may register (deny by default).
	flagSubscriberPrefixes = "cal-diy-webhook-subscriber-prefixes"
)

// MaxResponseBytesLimit is the largest --cal-diy-max-response-bytes
// accepted (64 MiB, as the reference's client allows).
const MaxResponseBytesLimit = 64 << 20

// MaxWebhookSubscriptions bounds the entries of
// --cal-diy-webhook-secret-files.
const MaxWebhookSubscriptions = 64

// Product is Cal.diy as cmd/aip-host runs it ("aip-host cal-diy").
var Product = products.Product{
	Name: "cal-diy",
	Summary: "Cal.diy (Cal.com API v2): profile, event types and their private links, slots and reservations, bookings and " +
		"attendees, schedules, calendars, conferencing, user and event type webhooks; signed booking webhooks",
	Settings: []hostsdk.Setting{
		{Flag: flagBaseURL, Env: "AIP_CAL_DIY_BASE_URL",
			Usage: "origin of the Cal.diy API v2, e.g. https://api.cal.com (https; http only for loopback)"},
		{Flag: flagBearerTokenFile, Env: "AIP_CAL_DIY_BEARER_TOKEN_FILE",
			Usage: "owner-only file holding the Cal.diy API key (cal_...) sent as Authorization: Bearer"},
		{Flag: flagMaxResponseBytes, Env: "AIP_CAL_DIY_MAX_RESPONSE_BYTES", Kind: hostsdk.SettingInt,
			Min: 1024, Max: MaxResponseBytesLimit,
			Usage: "largest Cal.diy answer read, in bytes (default 8 MiB, at most 64 MiB)"},
		{Flag: flagWebhookSecrets, Env: "AIP_CAL_DIY_WEBHOOK_SECRET_FILES",
			Usage: "comma list of SUBSCRIPTION_ID=FILE: each file holds one webhook subscription's signing secret; " +
				"enables POST /webhooks/cal-diy/{subscription_id}"},
		{Flag: flagPreviousWebhookSecrets, Env: "AIP_CAL_DIY_WEBHOOK_PREVIOUS_SECRET_FILES",
			Usage: "comma list of SUBSCRIPTION_ID=FILE: each file holds the secret being replaced of a subscription of --" + flagWebhookSecrets +
				", also accepted while Cal.diy switches to the new one; remove the entry once the switch is done"},
		{Flag: flagSubscriberPrefixes, Env: "AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES",
			Usage: "comma list of https URL prefixes ending in / that webhook.create/update and event_type.webhook.create/update may register " +
				"as <prefix><subscription_id>; empty (the default) refuses every subscriber URL"},
	},
	New: provider.FromSettings(newFromSettings),
}

// subscriptionRE is the syntax of a webhook subscription ID: 1 to 128
// characters, the first alphanumeric.
var subscriptionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$`)

func newFromSettings(v hostsdk.SettingValues, logger *slog.Logger) (hostsdk.Connector, error) {
	base, err := provider.ParseBaseURL("--"+flagBaseURL+" (AIP_CAL_DIY_BASE_URL)", v[flagBaseURL], false, false)
	if err != nil {
		return nil, err
	}
	token, err := provider.ReadSecret("--"+flagBearerTokenFile+" (AIP_CAL_DIY_BEARER_TOKEN_FILE)", v[flagBearerTokenFile], logger)
	if err != nil {
		return nil, err
	}
	secrets, err := parseWebhookSecrets(flagWebhookSecrets, "AIP_CAL_DIY_WEBHOOK_SECRET_FILES", v[flagWebhookSecrets], logger)
	if err != nil {
		return nil, err
	}
	previous, err := parseWebhookSecrets(flagPreviousWebhookSecrets, "AIP_CAL_DIY_WEBHOOK_PREVIOUS_SECRET_FILES", v[flagPreviousWebhookSecrets], logger)
	if err != nil {
		return nil, err
	}
	prefixes, err := parseSubscriberPrefixes(v[flagSubscriberPrefixes])
	if err != nil {
		return nil, err
	}
	return New(Config{
		BaseURL:                base,
		Token:                  token,
		MaxResponseBytes:       v.Int(flagMaxResponseBytes),
		WebhookSecrets:         secrets,
		PreviousWebhookSecrets: previous,
		SubscriberPrefixes:     prefixes,
		Logger:                 logger,
	})
}

// parseWebhookSecrets reads --cal-diy-webhook-secret-files (an empty
// value is no webhook route) or --cal-diy-webhook-previous-secret-files,
// named flag and env.
func parseWebhookSecrets(flag, env, raw string, logger *slog.Logger) (map[string]provider.Secret, error) {
	what := "--" + flag + " (" + env + ")"
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	out := map[string]provider.Secret{}
	for _, entry := range strings.Split(raw, ",") {
		entry = strings.TrimSpace(entry)
		id, file, ok := strings.Cut(entry, "=")
		if !ok || file == "" {
			return nil, fmt.Errorf("%s: entry %q is not SUBSCRIPTION_ID=FILE", what, entry)
		}
		if !subscriptionRE.MatchString(id) {
			return nil, fmt.Errorf("%s: subscription ID %q must be 1 to 128 characters, the first a letter or digit, the rest letters, digits or . _ ~ -", what, id)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("%s: subscription ID %q is given twice", what, id)
		}
		if len(out) == MaxWebhookSubscriptions {
			return nil, fmt.Errorf("%s: more than %d subscriptions", what, MaxWebhookSubscriptions)
		}
		s, err := provider.ReadSecret(fmt.Sprintf("%s: subscription %s", what, id), file, logger)
		if err != nil {
			return nil, err
		}
		out[id] = s
	}
	return out, nil
}

// Config configures a Connector.
type Config struct {
	// BaseURL is the Cal.diy origin (checked with provider.ParseBaseURL).
	BaseURL *url.URL
	// Token is the API key sent as Authorization: Bearer.
	Token provider.Secret
	// MaxResponseBytes bounds an answer (0: provider.DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// WebhookSecrets maps a webhook subscription ID to its signing secret.
	// Without any, the webhook route is not mounted.
	WebhookSecrets map[string]provider.Secret
	// PreviousWebhookSecrets maps some of WebhookSecrets' subscription
	// IDs to the secret being replaced, which verifies deliveries too
	// while Cal.diy switches to the subscription's secret. Webhook
	// creates and updates send WebhookSecrets' secret, never these.
	PreviousWebhookSecrets map[string]provider.Secret
	// SubscriberPrefixes are the https URL prefixes (each ending in /)
	// that webhook and event type webhook creates and updates may register, followed by a
	// subscription ID. None: every subscriber URL is refused.
	SubscriberPrefixes []string
	// Now is the clock for webhook timestamps. Defaults to time.Now.
	Now func() time.Time
	// Transport is the provider client's round tripper (nil: a clone of
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Logger defaults to one that discards everything.
	Logger *slog.Logger
}

// New returns a connector for cfg.
func New(cfg Config) (*Connector, error) {
	if cfg.BaseURL == nil {
		return nil, errors.New("no base URL; set --" + flagBaseURL)
	}
	if cfg.Token.Empty() {
		return nil, errors.New("no API key; set --" + flagBearerTokenFile)
	}
	if cfg.MaxResponseBytes < 0 || cfg.MaxResponseBytes > MaxResponseBytesLimit {
		return nil, fmt.Errorf("--%s must be 1 to %d bytes", flagMaxResponseBytes, MaxResponseBytesLimit)
	}
	for id, s := range cfg.WebhookSecrets {
		if !subscriptionRE.MatchString(id) || s.Empty() {
			return nil, fmt.Errorf("webhook subscription %q needs a valid ID and a secret; fix --%s", id, flagWebhookSecrets)
		}
	}
	for id, s := range cfg.PreviousWebhookSecrets {
		cur, ok := cfg.WebhookSecrets[id]
		switch {
		case !ok:
			return nil, fmt.Errorf("--%s names subscription %q, which --%s does not: give the subscription's new secret there and the one it replaces here", flagPreviousWebhookSecrets, id, flagWebhookSecrets)
		case s.Empty():
			return nil, fmt.Errorf("webhook subscription %q needs a previous secret; fix --%s", id, flagPreviousWebhookSecrets)
		case s.Reveal() == cur.Reveal():
			return nil, fmt.Errorf("--%s holds the same secret for subscription %q as --%s: give it the secret being replaced, or leave the subscription out", flagPreviousWebhookSecrets, id, flagWebhookSecrets)
		}
	}
	if len(cfg.SubscriberPrefixes) > MaxSubscriberPrefixes {
		return nil, fmt.Errorf("--%s (AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES) lists %d prefixes, more than %d: list fewer (a prefix allows every subscriber URL that starts with it)",
			flagSubscriberPrefixes, len(cfg.SubscriberPrefixes), MaxSubscriberPrefixes)
	}
	for _, p := range cfg.SubscriberPrefixes {
		if err := checkSubscriberPrefix(p); err != nil {
			return nil, fmt.Errorf("--%s (AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES): %w", flagSubscriberPrefixes, err)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	token := cfg.Token
	// The signing secrets webhook creates and updates send in their
	// bodies are credentials too: an error quoting an echoed body
	// redacts them like the API key, which is listed for the client to
	// re-read it when Cal.diy refuses it (provider.Config.Secrets).
	secrets := make([]provider.Secret, 0, 1+len(cfg.WebhookSecrets)+len(cfg.PreviousWebhookSecrets))
	secrets = append(secrets, token)
	for _, s := range cfg.WebhookSecrets {
		secrets = append(secrets, s)
	}
	for _, s := range cfg.PreviousWebhookSecrets {
		secrets = append(secrets, s)
	}
	client, err := provider.New(provider.Config{
		Product:          "cal-diy",
		BaseURL:          cfg.BaseURL,
		MaxResponseBytes: cfg.MaxResponseBytes,
		Timeout:          30 * time.Second,
		UserAgent:        "aipfleet-cal-diy",
		Auth:             func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token.Reveal()) },
		Secrets:          secrets,
		Transport:        cfg.Transport,
	})
	if err != nil {
		return nil, err
	}
	return &Connector{cfg: cfg, client: client}, nil
}
