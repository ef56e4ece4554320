package hermes

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

// Setting flags of the product.
const (
	FlagEndpointsFile    = "hermes-endpoints-file"
	FlagMaxResponseBytes = "hermes-max-response-bytes"
	FlagDefaultModel     = "hermes-default-model"
)

// Bounds and defaults.
const (
	// DefaultModel is the model sent to the OpenAI-compatible endpoints
	// when the action names none.
	DefaultModel = "hermes-agent"
	// DefaultMaxResponseBytes bounds a JSON answer and a whole SSE stream.
	DefaultMaxResponseBytes = 16 << 20
	// MaxMaxResponseBytes is the largest --hermes-max-response-bytes.
	MaxMaxResponseBytes = 256 << 20
	// MaxFrameBytes bounds one SSE event (its lines together).
	MaxFrameBytes = 1 << 20
	// MaxEndpoints bounds the endpoints file's array.
	MaxEndpoints = 1000
	// MaxEndpointsFileBytes bounds the endpoints file.
	MaxEndpointsFileBytes = 4 << 20
	// RequestTimeout bounds one provider request; the action's timeout
	// bounds it too.
	RequestTimeout = 900 * time.Second
	// UserAgent is sent with every request.
	UserAgent = "aipfleet-hermes-agent/1"
)

var endpointIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// Product is Hermes Agent as aip-host runs it.
var Product = products.Product{
	Name:    "hermes-agent",
	Summary: "Hermes Agent API servers (OpenAI-compatible chat and responses, runs and their events, sessions, scheduled jobs)",
	Settings: []hostsdk.Setting{
		{Flag: FlagEndpointsFile, Env: "AIP_HERMES_ENDPOINTS_FILE",
			Usage: `JSON file: array of 1 to 1000 {"id","base_url","api_key_file"?,"display_name"?,"default_model"?} (required)`},
		{Flag: FlagMaxResponseBytes, Env: "AIP_HERMES_MAX_RESPONSE_BYTES", Kind: hostsdk.SettingInt,
			Min: 1024, Max: MaxMaxResponseBytes,
			Usage: "bound on a JSON answer and on a whole SSE stream (chat, run events, session chat), in bytes (default 16777216)"},
		{Flag: FlagDefaultModel, Env: "AIP_HERMES_DEFAULT_MODEL",
			Usage: `model sent to /v1/chat/completions and /v1/responses when the action names none and the endpoint has no default_model (default "hermes-agent")`,
			Check: checkModel},
	},
	New: provider.FromSettings(func(values hostsdk.SettingValues, logger *slog.Logger) (*Connector, error) {
		return New(Config{
			EndpointsFile:    values[FlagEndpointsFile],
			MaxResponseBytes: values.Int(FlagMaxResponseBytes),
			DefaultModel:     values[FlagDefaultModel],
			Logger:           logger,
		})
	}),
}

func checkModel(v string) error {
	if len(v) > 256 || strings.TrimSpace(v) != v || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return errors.New("want a model name of at most 256 characters without surrounding spaces or control characters")
	}
	return nil
}

// Config configures a Connector.
type Config struct {
	// EndpointsFile is the JSON endpoints file (required).
	EndpointsFile string
	// MaxResponseBytes bounds a JSON answer and a whole SSE stream (chat, run events, session chat)
	// (0: DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// DefaultModel is the model for chat and responses when the action
	// names none ("": DefaultModel).
	DefaultModel string
	// Logger receives warnings (nil: discarded).
	Logger *slog.Logger
	// Transport is the round tripper of every provider call (nil: a clone
	// of http.DefaultTransport).
	Transport http.RoundTripper
	// PollInterval is the wait between run status reads of run_start with
	// wait (0: 2 s).
	PollInterval time.Duration
}

// endpointFile is one element of the endpoints file.
type endpointFile struct {
	ID          string `json:"id"`
	BaseURL     string `json:"base_url"`
	APIKeyFile  string `json:"api_key_file,omitempty"`
	DisplayName string `json:"display_name,omitempty"`
	// DefaultModel overrides --hermes-default-model for this endpoint
	// (a profile served under its own model name).
	DefaultModel string `json:"default_model,omitempty"`
}

// endpoint is one configured Hermes API server.
type endpoint struct {
	id          string // lowercased, as in capability IDs
	displayName string
	client      *provider.Client
	// maxBytes bounds a whole SSE stream (chat, run events, session chat) (--hermes-max-response-bytes).
	maxBytes int64
	// defaultModel is the model of chat and responses when the action
	// names none: the endpoint's default_model, else --hermes-default-model.
	defaultModel string
}

// New reads the endpoints file and its key files and returns the
// connector. It does no network I/O.
func New(cfg Config) (*Connector, error) {
	what := "--" + FlagEndpointsFile + " (AIP_HERMES_ENDPOINTS_FILE)"
	if cfg.EndpointsFile == "" {
		return nil, fmt.Errorf("%s: no file given; list the Hermes API servers to front", what)
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxResponseBytes < 1024 || cfg.MaxResponseBytes > MaxMaxResponseBytes {
		return nil, fmt.Errorf("--%s (AIP_HERMES_MAX_RESPONSE_BYTES): %d is out of range; want 1024 to %d", FlagMaxResponseBytes, cfg.MaxResponseBytes, MaxMaxResponseBytes)
	}
	if cfg.DefaultModel == "" {
		cfg.DefaultModel = DefaultModel
	}
	if err := checkModel(cfg.DefaultModel); err != nil {
		return nil, fmt.Errorf("--%s (AIP_HERMES_DEFAULT_MODEL): %w", FlagDefaultModel, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 2 * time.Second
	}
	list, err := provider.ReadJSONList[endpointFile](what, cfg.EndpointsFile, MaxEndpointsFileBytes, MaxEndpoints,
		"{id, base_url, api_key_file, display_name, default_model}")
	if err != nil {
		return nil, err
	}
	if len(list) > MaxEndpointsPerHost {
		return nil, fmt.Errorf("%s: %d endpoints make %d capabilities (%d each), more than the %d a manifest may hold; list at most %d endpoints per host",
			what, len(list), len(list)*len(operations), len(operations), hostsdk.MaxCapabilities, MaxEndpointsPerHost)
	}
	c := &Connector{log: cfg.Logger, poll: cfg.PollInterval, health: provider.NewTargets("endpoint", "endpoint", cfg.Logger),
		outageBudget: provider.DefaultOutageBudget, backoffCap: provider.DefaultBackoffCap}
	c.byID = make(map[string]*endpoint, len(list))
	for i, e := range list {
		at := fmt.Sprintf("%s: endpoint %d", what, i)
		if !endpointIDPattern.MatchString(e.ID) {
			return nil, fmt.Errorf("%s: id %q must be 1 to 128 of A-Z a-z 0-9 _ -", at, e.ID)
		}
		id := strings.ToLower(e.ID)
		if _, dup := c.byID[id]; dup {
			return nil, fmt.Errorf("%s: id %q is listed twice (ids are compared lowercased); give each endpoint its own id", at, e.ID)
		}
		at = fmt.Sprintf("%s: endpoint %q", what, e.ID)
		if len(e.DisplayName) > 256 || strings.ContainsFunc(e.DisplayName, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, fmt.Errorf("%s: display_name must be at most 256 characters without control characters", at)
		}
		model := cfg.DefaultModel
		if e.DefaultModel != "" {
			if err := checkModel(e.DefaultModel); err != nil {
				return nil, fmt.Errorf("%s: default_model: %w", at, err)
			}
			model = e.DefaultModel
		}
		base, err := provider.ParseBaseURL(at+" base_url", e.BaseURL, true, false)
		if err != nil {
			return nil, err
		}
		var key provider.Secret
		if e.APIKeyFile != "" {
			if key, err = provider.ReadSecret(at+" api_key_file", e.APIKeyFile, cfg.Logger); err != nil {
				return nil, err
			}
		} else {
			cfg.Logger.Warn("hermes endpoint has no api_key_file; requests are sent without a bearer key, which Hermes refuses unless its API_SERVER_KEY is unset", "endpoint", id)
		}
		auth := func(r *http.Request) {
			if !key.Empty() {
				r.Header.Set("Authorization", "Bearer "+key.Reveal())
			}
		}
		pc, err := provider.New(provider.Config{Product: "hermes-agent " + id, BaseURL: base,
			MaxResponseBytes: cfg.MaxResponseBytes, Timeout: RequestTimeout, UserAgent: UserAgent,
			Auth: auth, Secrets: []provider.Secret{key}, Transport: cfg.Transport})
		if err != nil {
			return nil, err
		}
		ep := &endpoint{id: id, displayName: e.DisplayName, client: pc, maxBytes: cfg.MaxResponseBytes, defaultModel: model}
		c.endpoints = append(c.endpoints, ep)
		c.byID[id] = ep
	}
	return c, nil
}

// endpointPath joins a fixed route and escaped caller-given segments.
func endpointPath(route string, segments ...string) string {
	var b strings.Builder
	b.WriteString(route)
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}
