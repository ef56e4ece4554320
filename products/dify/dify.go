package dify

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Setting names (flags without dashes).
const (
	FlagBaseURL          = "dify-base-url"
	FlagAppsFile         = "dify-apps-file"
	FlagKnowledgeFile    = "dify-knowledge-file"
	FlagMaxResponseBytes = "dify-max-response-bytes"
)

// Bounds of the configuration.
const (
	// MaxEntries bounds the apps file and the knowledge file.
	MaxEntries = 1000
	// MaxConfigFileBytes bounds the apps and knowledge files.
	MaxConfigFileBytes = 4 << 20
	// MaxResponseBytesLimit is the largest --dify-max-response-bytes.
	MaxResponseBytesLimit = 64 << 20
	// DefaultStreamIdleTimeout is how long an app's event stream may stay
	// silent (Dify pings every 10 seconds) before it counts as dropped.
	DefaultStreamIdleTimeout = 2 * time.Minute
)

// Product is Dify's Service API as an aip-host product.
var Product = products.Product{
	Name:    "dify",
	Summary: "Dify Service API: run chat, agent, completion and workflow apps; app info, conversations, messages, feedback, workflow runs and logs, file upload, speech to text; knowledge retrieval and documents (by text or by file), knowledge pipeline (datasource nodes, runs, file upload)",
	Settings: []hostsdk.Setting{
		{Flag: FlagBaseURL, Env: "AIP_DIFY_BASE_URL", Kind: hostsdk.SettingString,
			Usage: "Dify Service API base URL, with its path (https://api.dify.ai/v1); plain http only to loopback"},
		{Flag: FlagAppsFile, Env: "AIP_DIFY_APPS_FILE", Kind: hostsdk.SettingString,
			Usage: "JSON file: array of {id, name, mode, description?, api_key_file}; mode is chat, advanced-chat, agent-chat, completion or workflow"},
		{Flag: FlagKnowledgeFile, Env: "AIP_DIFY_KNOWLEDGE_FILE", Kind: hostsdk.SettingString,
			Usage: "JSON file: array of knowledge bases {id (the dataset ID), name, description?, api_key_file}"},
		{Flag: FlagMaxResponseBytes, Env: "AIP_DIFY_MAX_RESPONSE_BYTES", Kind: hostsdk.SettingInt,
			Min: 1024, Max: MaxResponseBytesLimit,
			Usage: "largest provider answer (and app event stream) read, in bytes (default 8 MiB)"},
	},
	New: provider.FromSettings(func(values hostsdk.SettingValues, logger *slog.Logger) (*Connector, error) {
		return New(Config{
			BaseURL:          values[FlagBaseURL],
			AppsFile:         values[FlagAppsFile],
			KnowledgeFile:    values[FlagKnowledgeFile],
			MaxResponseBytes: values.Int(FlagMaxResponseBytes),
			Logger:           logger,
		})
	}),
}

// Config configures New.
type Config struct {
	// BaseURL is the Service API base URL, path included
	// ("https://api.dify.ai/v1").
	BaseURL string
	// AppsFile and KnowledgeFile name the JSON configuration files; at
	// least one must list an entry.
	AppsFile      string
	KnowledgeFile string
	// MaxResponseBytes bounds every answer and every app event stream.
	// Defaults to provider.DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// StreamIdleTimeout bounds the silence of an app's event stream.
	// Defaults to DefaultStreamIdleTimeout.
	StreamIdleTimeout time.Duration
	// Transport is the round tripper (nil: a clone of
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Logger defaults to a logger that discards everything.
	Logger *slog.Logger
}

// Mode is a Dify app's type.
type Mode string

// App modes.
const (
	ModeChat         Mode = "chat"
	ModeAdvancedChat Mode = "advanced-chat"
	ModeAgentChat    Mode = "agent-chat"
	ModeCompletion   Mode = "completion"
	ModeWorkflow     Mode = "workflow"
)

func (m Mode) valid() bool {
	switch m {
	case ModeChat, ModeAdvancedChat, ModeAgentChat, ModeCompletion, ModeWorkflow:
		return true
	}
	return false
}

// chat reports whether the app has conversations.
func (m Mode) chat() bool { return m == ModeChat || m == ModeAdvancedChat || m == ModeAgentChat }

// usesTools reports whether an app of mode m can act outside Dify while it
// runs: an agent calls tools, a chatflow or workflow runs tool and HTTP
// nodes; a chatbot or text generator only answers.
func (m Mode) usesTools() bool {
	return m == ModeAgentChat || m == ModeAdvancedChat || m == ModeWorkflow
}

// appEntry is one element of the apps file.
type appEntry struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Mode        Mode   `json:"mode"`
	Description string `json:"description,omitempty"`
	APIKeyFile  string `json:"api_key_file"`
}

// knowledgeEntry is one element of the knowledge file.
type knowledgeEntry struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	APIKeyFile  string `json:"api_key_file"`
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// Bounds of names and descriptions in the configuration files.
const (
	maxNameLen        = 200
	maxDescriptionLen = 2000
)

// app is a configured app with its client.
type app struct {
	appEntry
	key    provider.Secret
	client *provider.Client
}

// dataset is a configured knowledge base with its client.
type dataset struct {
	knowledgeEntry
	client *provider.Client
}

// New validates cfg, reads every API key file and returns the connector.
// Errors name the setting to fix.
func New(cfg Config) (*Connector, error) {
	base, err := provider.ParseBaseURL("--"+FlagBaseURL+" (AIP_DIFY_BASE_URL)", cfg.BaseURL, true, false)
	if err != nil {
		return nil, err
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = provider.DefaultMaxResponseBytes
	}
	if cfg.MaxResponseBytes < 0 || cfg.MaxResponseBytes > MaxResponseBytesLimit {
		return nil, fmt.Errorf("--%s: %d is out of range; give 1024 to %d bytes", FlagMaxResponseBytes, cfg.MaxResponseBytes, MaxResponseBytesLimit)
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if cfg.AppsFile == "" && cfg.KnowledgeFile == "" {
		return nil, fmt.Errorf("--%s and --%s are both unset; give at least one app or knowledge base", FlagAppsFile, FlagKnowledgeFile)
	}
	c := &Connector{cfg: cfg, base: base, apps: map[string]*app{}, datasets: map[string]*dataset{},
		appHealth: provider.NewTargets("app", "app_id", cfg.Logger), datasetHealth: provider.NewTargets("knowledge base", "dataset_id", cfg.Logger)}
	newClient := func(key provider.Secret) (*provider.Client, error) {
		return provider.New(provider.Config{
			Product: "dify", BaseURL: base, MaxResponseBytes: cfg.MaxResponseBytes,
			UserAgent: userAgent, Transport: cfg.Transport,
			Auth:    func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+key.Reveal()) },
			Secrets: []provider.Secret{key},
		})
	}
	if cfg.AppsFile != "" {
		entries, err := provider.ReadJSONList[appEntry]("--"+FlagAppsFile+" (AIP_DIFY_APPS_FILE)", cfg.AppsFile, MaxConfigFileBytes, MaxEntries,
			"{id, name, mode, description, api_key_file}")
		if err != nil {
			return nil, err
		}
		for i, e := range entries {
			what := fmt.Sprintf("--%s %s: app %d", FlagAppsFile, cfg.AppsFile, i)
			if err := checkEntry(what, e.ID, e.Name, e.Description); err != nil {
				return nil, err
			}
			if !e.Mode.valid() {
				return nil, fmt.Errorf("%s (%s): mode %q: want chat, advanced-chat, agent-chat, completion or workflow", what, e.ID, e.Mode)
			}
			if _, dup := c.apps[e.ID]; dup {
				return nil, fmt.Errorf("%s: id %q is listed twice; app ids must be unique", what, e.ID)
			}
			key, err := provider.ReadSecret(fmt.Sprintf("%s (%s) api_key_file", what, e.ID), e.APIKeyFile, cfg.Logger)
			if err != nil {
				return nil, err
			}
			cl, err := newClient(key)
			if err != nil {
				return nil, err
			}
			c.apps[e.ID] = &app{appEntry: e, key: key, client: cl}
			c.appOrder = append(c.appOrder, e.ID)
		}
	}
	if cfg.KnowledgeFile != "" {
		entries, err := provider.ReadJSONList[knowledgeEntry]("--"+FlagKnowledgeFile+" (AIP_DIFY_KNOWLEDGE_FILE)", cfg.KnowledgeFile, MaxConfigFileBytes, MaxEntries,
			"{id, name, description, api_key_file}")
		if err != nil {
			return nil, err
		}
		for i, e := range entries {
			what := fmt.Sprintf("--%s %s: knowledge base %d", FlagKnowledgeFile, cfg.KnowledgeFile, i)
			if err := checkEntry(what, e.ID, e.Name, e.Description); err != nil {
				return nil, err
			}
			if _, dup := c.datasets[e.ID]; dup {
				return nil, fmt.Errorf("%s: id %q is listed twice; knowledge ids must be unique", what, e.ID)
			}
			key, err := provider.ReadSecret(fmt.Sprintf("%s (%s) api_key_file", what, e.ID), e.APIKeyFile, cfg.Logger)
			if err != nil {
				return nil, err
			}
			cl, err := newClient(key)
			if err != nil {
				return nil, err
			}
			c.datasets[e.ID] = &dataset{knowledgeEntry: e, client: cl}
			c.datasetOrder = append(c.datasetOrder, e.ID)
		}
	}
	if n := c.capabilityCount(); n > hostsdk.MaxCapabilities {
		return nil, fmt.Errorf("--%s and --%s describe %d capabilities; a manifest holds at most %d: split the apps and knowledge bases over several hosts",
			FlagAppsFile, FlagKnowledgeFile, n, hostsdk.MaxCapabilities)
	}
	c.index()
	return c, nil
}

const userAgent = "aipfleet-dify/1"

func checkEntry(what, id, name, description string) error {
	switch {
	case !idPattern.MatchString(id):
		return fmt.Errorf("%s: id %q: want 1 to 128 of A-Z, a-z, 0-9, _ and -", what, id)
	case name == "" || len(name) > maxNameLen:
		return fmt.Errorf("%s (%s): name must be 1 to %d bytes", what, id, maxNameLen)
	case len(description) > maxDescriptionLen:
		return fmt.Errorf("%s (%s): description is longer than %d bytes", what, id, maxDescriptionLen)
	}
	return nil
}

// escape is url.PathEscape, for caller-given path segments.
func escape(s string) string { return url.PathEscape(s) }
