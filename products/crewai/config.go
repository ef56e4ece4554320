package crewai

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Setting flags (each with its AIP_CREWAI_* variable).
const (
	FlagCrewsFile        = "crewai-crews-file"
	FlagMaxResponseBytes = "crewai-max-response-bytes"
	FlagPollInterval     = "crewai-poll-interval-ms"
	FlagOutageBudget     = "crewai-outage-budget-ms"
)

// Bounds and defaults.
const (
	// MaxCrewsFileBytes bounds the crews file.
	MaxCrewsFileBytes = 4 << 20
	// MaxCrews bounds the crews file's entries.
	MaxCrews = 1000
	// CapabilitiesPerCrew is how many capabilities one crew adds to the
	// manifest, so a host serves at most hostsdk.MaxCapabilities /
	// CapabilitiesPerCrew crews.
	CapabilitiesPerCrew = 4
	// MaxDescriptionBytes bounds a crew's description.
	MaxDescriptionBytes = 16 << 10
	// DefaultMaxResponseBytes and MaxMaxResponseBytes bound
	// --crewai-max-response-bytes.
	DefaultMaxResponseBytes = 64 << 20
	MaxMaxResponseBytes     = 256 << 20
	MinMaxResponseBytes     = 1 << 10
	// DefaultPollInterval is how often a run's status is read.
	DefaultPollInterval = time.Second
	MinPollInterval     = 50 * time.Millisecond
	MaxPollInterval     = 10 * time.Minute
	// DefaultOutageBudget is how long a run's status reads may keep
	// failing transiently (no answer, 5xx, 408, 429) before the wait for
	// the run ends outcome_unknown (--crewai-outage-budget-ms).
	DefaultOutageBudget = provider.DefaultOutageBudget
	MinOutageBudget     = time.Second
	MaxOutageBudget     = 24 * time.Hour
)

// Product is the CrewAI adapter as cmd/aip-host runs it.
var Product = products.Product{
	Name:    "crewai",
	Summary: "deployed crews on CrewAI AMP (kickoff and wait, status, inputs, human-feedback resume)",
	Settings: []hostsdk.Setting{
		{Flag: FlagCrewsFile, Env: "AIP_CREWAI_CREWS_FILE",
			Usage: "JSON file listing the crews: an array of {id, base_url, token_file, description} (required)"},
		{Flag: FlagMaxResponseBytes, Env: "AIP_CREWAI_MAX_RESPONSE_BYTES", Kind: hostsdk.SettingInt,
			Min: MinMaxResponseBytes, Max: MaxMaxResponseBytes,
			Usage: fmt.Sprintf("largest CrewAI AMP answer read, in bytes (default %d)", DefaultMaxResponseBytes)},
		{Flag: FlagPollInterval, Env: "AIP_CREWAI_POLL_INTERVAL_MS", Kind: hostsdk.SettingMillis,
			Min: MinPollInterval.Milliseconds(), Max: MaxPollInterval.Milliseconds(),
			Usage: fmt.Sprintf("how often a running crew's status is read, in ms (default %d)", DefaultPollInterval.Milliseconds())},
		{Flag: FlagOutageBudget, Env: "AIP_CREWAI_OUTAGE_BUDGET_MS", Kind: hostsdk.SettingMillis,
			Min: MinOutageBudget.Milliseconds(), Max: MaxOutageBudget.Milliseconds(),
			Usage: fmt.Sprintf("how long a run's status reads may keep failing (no answer, 5xx, 408, 429; retried with backoff up to %s) before the run is outcome_unknown, in ms (default %d)",
				provider.DefaultBackoffCap, DefaultOutageBudget.Milliseconds())},
	},
	New: provider.FromSettings(newFromSettings),
}

// crewIDPattern is what a crew id may be: it becomes part of capability
// IDs.
var crewIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// crewEntry is one element of the crews file.
type crewEntry struct {
	ID          string  `json:"id"`
	BaseURL     string  `json:"base_url"`
	TokenFile   string  `json:"token_file"`
	Description *string `json:"description"`
}

// crew is one configured deployed crew.
type crew struct {
	id          string
	description string
	client      *provider.Client
}

func newFromSettings(values hostsdk.SettingValues, logger *slog.Logger) (hostsdk.Connector, error) {
	maxBytes := values.Int(FlagMaxResponseBytes)
	if maxBytes == 0 {
		maxBytes = DefaultMaxResponseBytes
	}
	poll := values.Millis(FlagPollInterval)
	if poll == 0 {
		poll = DefaultPollInterval
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	crews, err := loadCrews(values[FlagCrewsFile], maxBytes, nil, logger)
	if err != nil {
		return nil, err
	}
	c := newConnector(crews, poll, logger)
	if budget := values.Millis(FlagOutageBudget); budget != 0 {
		c.outageBudget = budget
	}
	return c, nil
}

// loadCrews reads and checks the crews file and each crew's token, and
// builds a provider client per crew (over transport when not nil). A
// crew's token follows its file (provider.ReadSecret); a re-read that
// fails is logged on logger (nil: discarded).
func loadCrews(path string, maxResponseBytes int64, transport http.RoundTripper, logger *slog.Logger) ([]*crew, error) {
	what := "--" + FlagCrewsFile + " (AIP_CREWAI_CREWS_FILE)"
	entries, err := provider.ReadJSONList[crewEntry](what, path, MaxCrewsFileBytes, MaxCrews, "{id, base_url, token_file, description}")
	if err != nil {
		return nil, err
	}
	switch {
	case len(entries)*CapabilitiesPerCrew > hostsdk.MaxCapabilities:
		return nil, fmt.Errorf("%s: %s lists %d crews, but one host's manifest holds at most %d capabilities (%d per crew), so at most %d crews; split the file across several connector instances",
			what, path, len(entries), hostsdk.MaxCapabilities, CapabilitiesPerCrew, hostsdk.MaxCapabilities/CapabilitiesPerCrew)
	}
	seen := make(map[string]bool, len(entries))
	crews := make([]*crew, 0, len(entries))
	for i, e := range entries {
		if !crewIDPattern.MatchString(e.ID) {
			return nil, fmt.Errorf("%s: crew %d: id %q must be 1 to 128 letters, digits, '_' or '-'", what, i, e.ID)
		}
		if seen[e.ID] {
			return nil, fmt.Errorf("%s: crew id %q is listed twice; crew ids must be unique", what, e.ID)
		}
		seen[e.ID] = true
		cwhat := fmt.Sprintf("%s: crew %q", what, e.ID)
		base, err := provider.ParseBaseURL(cwhat+" base_url", e.BaseURL, false, false)
		if err != nil {
			return nil, err
		}
		var desc string
		if e.Description != nil {
			desc = *e.Description
			if len(desc) > MaxDescriptionBytes || !utf8.ValidString(desc) {
				return nil, fmt.Errorf("%s description: want valid UTF-8 of at most %d bytes", cwhat, MaxDescriptionBytes)
			}
		}
		tokenPath := e.TokenFile
		if tokenPath != "" && !filepath.IsAbs(tokenPath) {
			tokenPath = filepath.Join(filepath.Dir(path), tokenPath)
		}
		token, err := provider.ReadSecret(cwhat+" token_file", tokenPath, logger)
		if err != nil {
			return nil, err
		}
		client, err := newClient(base, token, maxResponseBytes, transport)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cwhat, err)
		}
		crews = append(crews, &crew{id: e.ID, description: desc, client: client})
	}
	return crews, nil
}

func newClient(base *url.URL, token provider.Secret, maxResponseBytes int64, transport http.RoundTripper) (*provider.Client, error) {
	return provider.New(provider.Config{
		Product:          "crewai",
		BaseURL:          base,
		MaxResponseBytes: maxResponseBytes,
		UserAgent:        "aipfleet-crewai",
		Transport:        transport,
		Auth: func(r *http.Request) {
			r.Header.Set("Authorization", "Bearer "+token.Reveal())
		},
		Secrets: []provider.Secret{token},
	})
}
