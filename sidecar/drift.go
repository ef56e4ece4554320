package sidecar

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// ManifestChangePolicy says what the sidecar does when the connector's
// manifest (or the MCP server's tool list) changes after registration. The
// admitted manifest is immutable: a change is never applied; it is always
// reported (a log line and GET /sidecar/status).
type ManifestChangePolicy string

// Manifest change policies.
const (
	// ManifestChangeReport reports the change and keeps serving the
	// admitted manifest (the default).
	ManifestChangeReport ManifestChangePolicy = "report"
	// ManifestChangeUnready also makes the replica not ready (its health
	// check fails, so heartbeats take it offline) until the connector's
	// manifest is the admitted one again.
	ManifestChangeUnready ManifestChangePolicy = "unready"
)

// validate checks the policy of field (Local.OnManifestChange or
// MCP.OnManifestChange) and sets the default.
func (p *ManifestChangePolicy) validate(field string) error {
	switch *p {
	case "":
		*p = ManifestChangeReport
	case ManifestChangeReport, ManifestChangeUnready:
	default:
		return cfgErr(field, fmt.Sprintf("is %q; want report or unready", *p))
	}
	return nil
}

// ManifestChange is a difference between the admitted manifest and the one
// the connector now describes, by capability ID.
type ManifestChange struct {
	Added      []string  `json:"added"`
	Removed    []string  `json:"removed"`
	Changed    []string  `json:"changed"`
	Other      bool      `json:"other"` // fields outside the capabilities (or only their order) changed
	DetectedAt time.Time `json:"detected_at"`
}

func (c *ManifestChange) String() string {
	var parts []string
	for _, p := range []struct {
		name string
		ids  []string
	}{{"added", c.Added}, {"removed", c.Removed}, {"changed", c.Changed}} {
		if len(p.ids) > 0 {
			parts = append(parts, p.name+" "+strings.Join(p.ids, ", "))
		}
	}
	if c.Other {
		parts = append(parts, "manifest fields outside the capabilities changed")
	}
	return strings.Join(parts, "; ")
}

// drift compares what the connector describes with the admitted manifest.
type drift struct {
	policy ManifestChangePolicy
	log    *slog.Logger

	mu       sync.Mutex
	admitted *aip.Manifest
	digest   string
	caps     map[string]string // capability ID -> digest
	rest     string            // digest of everything but the capabilities
	change   *ManifestChange
}

func newDrift(policy ManifestChangePolicy, log *slog.Logger) *drift {
	return &drift{policy: policy, log: log}
}

// admit records the manifest the host admits (the first discovery). Later
// calls (a second bootstrap of the same process) replace it.
func (d *drift) admit(m *aip.Manifest) {
	digest, caps, rest := fingerprint(m)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.admitted, d.digest, d.caps, d.rest, d.change = m, digest, caps, rest, nil
}

func (d *drift) hasAdmitted() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.admitted != nil
}

// observe compares m with the admitted manifest and reports a new change
// (or its end) once.
func (d *drift) observe(m *aip.Manifest) {
	digest, caps, rest := fingerprint(m)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.admitted == nil {
		return
	}
	if digest == d.digest {
		if d.change != nil {
			d.log.Info("the connector's manifest is the admitted one again")
			d.change = nil
		}
		return
	}
	c := &ManifestChange{DetectedAt: time.Now().UTC()}
	for id, dg := range caps {
		switch old, ok := d.caps[id]; {
		case !ok:
			c.Added = append(c.Added, id)
		case old != dg:
			c.Changed = append(c.Changed, id)
		}
	}
	for id := range d.caps {
		if _, ok := caps[id]; !ok {
			c.Removed = append(c.Removed, id)
		}
	}
	slices.Sort(c.Added)
	slices.Sort(c.Removed)
	slices.Sort(c.Changed)
	// Other also covers a change that is only the capabilities' order.
	c.Other = rest != d.rest || len(c.Added)+len(c.Removed)+len(c.Changed) == 0
	if d.change != nil && d.change.String() == c.String() {
		return // already reported
	}
	d.change = c
	d.log.Error("the connector's manifest changed after registration; the admitted manifest stays in force (admit a new connector version to apply the change)",
		"change", c.String(), "policy", string(d.policy))
}

// current returns the change in force, or nil.
func (d *drift) current() *ManifestChange {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.change == nil {
		return nil
	}
	c := *d.change
	return &c
}

// err fails health checks under ManifestChangeUnready while a change is in
// force.
func (d *drift) err() error {
	if d.policy != ManifestChangeUnready {
		return nil
	}
	if c := d.current(); c != nil {
		return fmt.Errorf("%w (%s)", ErrManifestChanged, c)
	}
	return nil
}

// fingerprint returns the manifest's digest, each capability's digest and
// the digest of the manifest without its capabilities.
func fingerprint(m *aip.Manifest) (string, map[string]string, string) {
	bound := *m
	bound.Agent.TrustDomain, bound.Agent.DID = "", ""
	digest, err := aip.Digest(&bound)
	if err != nil {
		digest = "invalid:" + err.Error()
	}
	bound.Capabilities = nil
	rest, err := aip.Digest(&bound)
	if err != nil {
		rest = "invalid:" + err.Error()
	}
	caps := make(map[string]string, len(m.Capabilities))
	for i := range m.Capabilities {
		c := &m.Capabilities[i]
		dg, err := aip.Digest(c)
		if err != nil {
			dg = "invalid:" + err.Error()
		}
		caps[c.ID] = dg
	}
	return digest, caps, rest
}
