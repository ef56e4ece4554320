// Package echoconnector is the echo connector: a complete AIP connector
// built with hostsdk, small enough to read in one sitting. echo.say echoes
// a message and counts its side effect per action ID in the runtime
// journal's state store (so a test can prove an action never ran twice);
// echo.stream sends progress chunks first. Both take delay_ms (a cancellable
// wait before the side effect) and hold_ms (a wait after it) for drain,
// cancel and crash experiments. It implements the optional Streamer,
// HealthChecker, Reconciler and ActionStateKeeper interfaces.
//
// The examples/echo command runs it as a standalone host, and
// `aipfleet host --connector echo` (which `aipfleet dev` starts) runs it as
// a built-in connector.
package echoconnector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Capabilities of the echo connector.
const (
	CapSay    = "echo.say"
	CapStream = "echo.stream"
)

// SideEffectsNamespace is the state namespace where echo counts its side
// effect per action ID: a test that the fleet never executes an action twice
// reads the count back in the output (side_effects).
const SideEffectsNamespace = "echo.side_effects"

// MaxDelay bounds delay_ms and hold_ms.
const MaxDelay = 10 * time.Minute

// Connector is a complete connector: echo.say echoes a message and records one
// side effect per action in the journal's state store; echo.stream sends
// progress chunks, then echoes. Both accept delay_ms (a cancellable wait
// before the side effect) and hold_ms (a wait after it, like a slow provider
// answer), for drain, cancel and crash tests.
type Connector struct{}

// sayInput is the input of both capabilities.
type sayInput struct {
	Message string `json:"message"`
	Chunks  int    `json:"chunks"`
	DelayMS int64  `json:"delay_ms"`
	HoldMS  int64  `json:"hold_ms"`
}

var inputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "message": {"type": "string", "maxLength": 65536},
    "delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
    "hold_ms": {"type": "integer", "minimum": 0, "maximum": 600000}
  },
  "required": ["message"],
  "additionalProperties": false
}`)

var streamInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "message": {"type": "string", "maxLength": 65536},
    "chunks": {"type": "integer", "minimum": 1, "maximum": 100},
    "delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
    "hold_ms": {"type": "integer", "minimum": 0, "maximum": 600000}
  },
  "required": ["message", "chunks"],
  "additionalProperties": false
}`)

var outputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "message": {"type": "string"},
    "side_effects": {"type": "integer", "minimum": 1},
    "chunks": {"type": "integer"},
    "reconciled": {"type": "boolean"}
  },
  "required": ["side_effects"]
}`)

// Output is the output of both capabilities and of a reconciled action
// (outputSchema). echo.say sets Message and SideEffects, echo.stream also
// Chunks; a reconciled action has only SideEffects and Reconciled (the
// message is not journaled with the side effect), so Message is a pointer:
// an empty message is still sent. The fields are in key order, so an
// output's bytes are those of the equivalent JSON object with sorted keys.
type Output struct {
	Chunks      uint64  `json:"chunks,omitempty"`
	Message     *string `json:"message,omitempty"`
	Reconciled  bool    `json:"reconciled,omitempty"`
	SideEffects int64   `json:"side_effects"`
}

func contract(streaming bool) *aip.CapabilityContract {
	latency := uint64(5)
	completion := aip.CompletionSync
	if streaming {
		completion = aip.CompletionStreaming
	}
	return &aip.CapabilityContract{
		SideEffects: []aip.SideEffect{aip.SideEffect("write")},
		Idempotency: aip.IdempotencyContract{
			Requirement:       aip.IdempotencyRequirement("required"),
			CollisionBehavior: aip.CollisionBehavior("return_original_result"),
			KeyScope:          aip.ScopeAction,
		},
		Execution: aip.ExecutionContract{
			SupportsSync: !streaming, SupportsStreaming: streaming, SupportsCancel: true,
			SupportsRetry: true, ExpectedCompletion: completion, RetrySafety: aip.RetrySafeWithIdempotencyKey,
		},
		Data:         aip.DataContract{Sensitivity: aip.SensitivityInternal},
		SLA:          &aip.SLAContract{ExpectedLatencyMS: &latency},
		Compensation: &aip.CompensationContract{Mode: aip.CompensationNotRequired},
	}
}

// ActionStateNamespaces implements hostsdk.ActionStateKeeper: an action's
// side-effect count goes when the host prunes the action.
func (Connector) ActionStateNamespaces() []string { return []string{SideEffectsNamespace} }

// Manifest implements hostsdk.Connector.
func (Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent: aip.Principal{ID: "agent:aipfleet-echo", Kind: aip.PrincipalAgent,
			DisplayName: "aipfleet echo connector"},
		Profiles: []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{
			{
				ID: CapSay, Name: "Echo a message", Kind: aip.KindTool,
				Description: "Returns the message and the number of times this action's side effect ran (always 1).",
				InputSchema: inputSchema, OutputSchema: outputSchema,
				Risk: aip.RiskLow, Stability: aip.StabilityStable, Contract: contract(false),
			},
			{
				ID: CapStream, Name: "Echo a message in chunks", Kind: aip.KindTool,
				Description: "Sends one progress chunk per step, then returns the message.",
				InputSchema: streamInputSchema, OutputSchema: outputSchema,
				Risk: aip.RiskLow, Stability: aip.StabilityStable, Contract: contract(true),
			},
		},
	}, nil
}

// Handle implements hostsdk.Connector.
func (e Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	in, err := decode(call)
	if err != nil {
		return nil, err
	}
	n, err := e.effect(ctx, call, in)
	if err != nil {
		return nil, err
	}
	return call.Complete(Output{Message: &in.Message, SideEffects: n})
}

// HandleStream implements hostsdk.Streamer.
func (e Connector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	in, err := decode(call)
	if err != nil {
		return nil, err
	}
	if in.Chunks < 1 {
		in.Chunks = 1
	}
	for i := range in.Chunks {
		if err := chunks.Send(aip.ChunkProgress, map[string]any{"index": i, "of": in.Chunks, "message": in.Message}); err != nil {
			return nil, err
		}
	}
	n, err := e.effect(ctx, call, in)
	if err != nil {
		return nil, err
	}
	return call.Complete(Output{Message: &in.Message, SideEffects: n, Chunks: chunks.Sent()})
}

func decode(call *hostsdk.Call) (sayInput, error) {
	var in sayInput
	if err := json.Unmarshal(call.Action.Input, &in); err != nil {
		return in, aip.NewProtocolError("echo.input", aip.CategoryPermanent, false, 0, err.Error())
	}
	return in, nil
}

// effect waits delay_ms (cancellable), records the side effect, then holds
// hold_ms. It returns how many times the effect has run for this action.
func (Connector) effect(ctx context.Context, call *hostsdk.Call, in sayInput) (int64, error) {
	if err := wait(ctx, in.DelayMS); err != nil {
		return 0, err // cancelled before the effect: nothing happened
	}
	var count int64
	_, _, err := call.State().Update(ctx, SideEffectsNamespace, call.Action.ID, func(cur json.RawMessage) (json.RawMessage, error) {
		count = 0
		if len(cur) > 0 {
			if err := json.Unmarshal(cur, &count); err != nil {
				return nil, err
			}
		}
		count++
		return json.RawMessage(strconv.FormatInt(count, 10)), nil
	})
	if err != nil {
		return 0, fmt.Errorf("record the side effect: %w: %w", err, hostsdk.ErrOutcomeUnknown)
	}
	call.Logger.Debug("side effect recorded", "side_effects", count)
	// The effect happened: a slow answer is not cancellable.
	if err := wait(context.WithoutCancel(ctx), in.HoldMS); err != nil {
		return 0, err
	}
	return count, nil
}

func wait(ctx context.Context, ms int64) error {
	if ms <= 0 {
		return nil
	}
	d := min(time.Duration(ms)*time.Millisecond, MaxDelay)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CheckHealth implements hostsdk.HealthChecker: echo has no provider.
func (Connector) CheckHealth(ctx context.Context) error { return ctx.Err() }

// Reconcile implements hostsdk.Reconciler: an action a crash left running
// completed when its side effect is recorded, and never ran otherwise.
func (Connector) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	v, err := u.State.Get(ctx, SideEffectsNamespace, u.Action.ActionID)
	var count int64
	switch {
	case err == nil:
		if err := json.Unmarshal(v.Value, &count); err != nil {
			return nil, fmt.Errorf("side-effect record of %s: %w", u.Action.ActionID, err)
		}
	case !isNotFound(err):
		return nil, err
	}
	if count == 0 {
		return &aip.ActionResult{ActionID: u.Action.ActionID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError("echo.not_executed", aip.CategoryConnector, false, 0,
				"the replica stopped before the side effect; it did not happen")}, nil
	}
	out, err := json.Marshal(Output{SideEffects: count, Reconciled: true})
	if err != nil {
		return nil, err
	}
	return &aip.ActionResult{ActionID: u.Action.ActionID, Status: aip.ResultCompleted, Output: out}, nil
}

func isNotFound(err error) bool { return errors.Is(err, journal.ErrNotFound) }

// Compile-time guards: the optional interfaces the host detects.
var (
	_ hostsdk.Connector         = Connector{}
	_ hostsdk.Streamer          = Connector{}
	_ hostsdk.HealthChecker     = Connector{}
	_ hostsdk.Reconciler        = Connector{}
	_ hostsdk.ActionStateKeeper = Connector{}
)
