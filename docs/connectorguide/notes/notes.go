// Package notes is the connector that docs/connector-guide.md builds: a
// tenant's notes, kept in the host's journal-backed state store. notes.add
// writes a note (a side effect, recorded once per action ID), notes.list
// reads them back. It is small on purpose; every piece of it is quoted by
// the guide and compiled and tested here.
package notes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Capabilities of the notes connector.
const (
	CapAdd  = "notes.add"
	CapList = "notes.list"
)

// stateNamespace is where the connector keeps its notes in the state store,
// one value per tenant.
const stateNamespace = "notes"

// Connector is the notes connector. Its zero value is ready to use.
type Connector struct{}

// Note is one stored note. IdempotencyKey is the key of the action that
// wrote it (the caller's idempotency_key, or the action ID): adding with
// the same key again, the same action delivered again or a caller's retry
// under a new action ID, finds it instead of writing a second note, as the
// contract's safe_with_idempotency_key promises.
type Note struct {
	ID             int    `json:"id"`
	Text           string `json:"text"`
	IdempotencyKey string `json:"idempotency_key"`
}

// Manifest implements hostsdk.Connector: who the connector is and what it
// offers, with a machine-readable contract per capability.
func (Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: "agent:notes", Kind: aip.PrincipalAgent, DisplayName: "Notes"},
		Profiles:        []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{
			{
				ID: CapAdd, Name: "Add a note", Kind: aip.KindTool,
				Description:  "Stores a note for the tenant and returns it with its number.",
				InputSchema:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","minLength":1,"maxLength":4096}},"required":["text"],"additionalProperties":false}`),
				OutputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"integer"},"text":{"type":"string"}},"required":["id","text"]}`),
				Risk:         aip.RiskLow, Stability: aip.StabilityStable,
				Contract: &aip.CapabilityContract{
					SideEffects: []aip.SideEffect{aip.EffectWrite},
					Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyRequired,
						CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
					Execution: aip.ExecutionContract{SupportsSync: true, SupportsRetry: true,
						ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafeWithIdempotencyKey},
					Data: aip.DataContract{Sensitivity: aip.SensitivityInternal},
				},
			},
			{
				ID: CapList, Name: "List the notes", Kind: aip.KindTool,
				Description: "Returns the tenant's notes, oldest first.",
				InputSchema: json.RawMessage(`{"type":"object","additionalProperties":false}`),
				Risk:        aip.RiskLow, Stability: aip.StabilityStable,
				Contract: &aip.CapabilityContract{
					SideEffects: []aip.SideEffect{aip.EffectRead},
					Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional,
						CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
					Execution: aip.ExecutionContract{SupportsSync: true, SupportsRetry: true,
						ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
					Data: aip.DataContract{Sensitivity: aip.SensitivityInternal},
				},
			},
		},
	}, nil
}

// Handle implements hostsdk.Connector. By the time it runs, the host has
// verified the dispatcher's signature and the pinned route, validated the
// input against the capability's input_schema and journaled the action.
func (c Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	switch call.Action.CapabilityID {
	case CapAdd:
		var in struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(call.Action.Input, &in); err != nil {
			return call.Fail("notes.input", aip.CategoryPermanent, false, err.Error()), nil
		}
		note, err := c.add(ctx, call, in.Text)
		if err != nil {
			return nil, err
		}
		return call.Complete(note)
	case CapList:
		notes, err := load(ctx, call.State(), call.Tenant.TenantID)
		if err != nil {
			return nil, err
		}
		return call.Complete(map[string]any{"notes": notes})
	}
	return call.Fail("notes.unknown_capability", aip.CategoryPermanent, false, "no capability "+call.Action.CapabilityID), nil
}

// add appends the note in one compare-and-set of the tenant's notes, unless
// an action with this idempotency key already wrote it. A storage error
// after the write may have committed, so it is reported as an unknown
// outcome, never as a failure.
func (Connector) add(ctx context.Context, call *hostsdk.Call, text string) (Note, error) {
	var note Note
	_, _, err := call.State().Update(ctx, stateNamespace, call.Tenant.TenantID, func(cur json.RawMessage) (json.RawMessage, error) {
		var notes []Note
		if len(cur) > 0 {
			if err := json.Unmarshal(cur, &notes); err != nil {
				return nil, err
			}
		}
		for _, n := range notes {
			if n.IdempotencyKey == call.IdempotencyKey {
				note = n
				return cur, nil // written by an earlier attempt with this key
			}
		}
		note = Note{ID: len(notes) + 1, Text: text, IdempotencyKey: call.IdempotencyKey}
		return json.Marshal(append(notes, note))
	})
	if err != nil {
		return Note{}, fmt.Errorf("store note: %w: %w", err, hostsdk.ErrOutcomeUnknown)
	}
	return note, nil
}

// load reads a tenant's notes.
func load(ctx context.Context, state *hostsdk.State, tenant string) ([]Note, error) {
	v, err := state.Get(ctx, stateNamespace, tenant)
	if errors.Is(err, journal.ErrNotFound) {
		return []Note{}, nil
	}
	if err != nil {
		return nil, err
	}
	var notes []Note
	return notes, json.Unmarshal(v.Value, &notes)
}

// CheckHealth implements hostsdk.HealthChecker. A connector with a provider
// checks here that it is reachable and its credentials work; the host
// probes it before registering and on every heartbeat.
func (Connector) CheckHealth(ctx context.Context) error { return ctx.Err() }

// Reconcile implements hostsdk.Reconciler: for an action a crash left
// running, the note it wrote (if any) says whether it completed. A list
// changed nothing and simply failed.
func (Connector) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	if u.Action.CapabilityID != CapAdd {
		return &aip.ActionResult{ActionID: u.Action.ActionID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError("notes.interrupted", aip.CategoryConnector, true, 0, "the replica stopped; nothing changed")}, nil
	}
	notes, err := load(ctx, u.State, u.Tenant.TenantID)
	if err != nil {
		return nil, err
	}
	for _, n := range notes {
		if n.IdempotencyKey == u.Action.IdempotencyKey {
			out, _ := json.Marshal(n)
			return &aip.ActionResult{ActionID: u.Action.ActionID, Status: aip.ResultCompleted, Output: out}, nil
		}
	}
	return &aip.ActionResult{ActionID: u.Action.ActionID, Status: aip.ResultFailed,
		Error: aip.NewProtocolError("notes.not_written", aip.CategoryConnector, true, 0, "the replica stopped before the note was written")}, nil
}

// Compile-time guards: the optional interfaces the host detects.
var (
	_ hostsdk.Connector     = Connector{}
	_ hostsdk.HealthChecker = Connector{}
	_ hostsdk.Reconciler    = Connector{}
)
