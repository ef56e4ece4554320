package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// DefaultCapabilityPrefix is prepended to MCP tool names to form capability
// IDs.
const DefaultCapabilityPrefix = "mcp."

// defaultToolOutputSchema describes the output of a tool without an
// outputSchema: its MCP content blocks (and structured content, if any).
var defaultToolOutputSchema = json.RawMessage(`{"type":"object","properties":{"content":{"type":"array","items":{"type":"object"}},"structured_content":{}},"required":["content"]}`)

// toolInfo is what the sidecar keeps about an admitted tool.
type toolInfo struct {
	name      string
	readOnly  bool
	hasOutput bool // the tool declares an outputSchema
}

// toolCapability maps an MCP tool to a capability:
//
//   - ID: prefix + tool name; name: the tool's title (or annotations.title,
//     or its name); description: the tool's description;
//   - input_schema: the tool's inputSchema; output_schema: the tool's
//     outputSchema (the action's output is then its structuredContent), or
//     a schema of {"content": [...]} (the action's output is then the
//     tool's content blocks);
//   - side effects from the annotations: readOnlyHint → read;
//     otherwise write, plus delete unless destructiveHint is false; plus
//     external_network unless openWorldHint is false;
//   - retry safety: safe for read-only or idempotentHint tools, else
//     unsafe; risk: low (read-only), medium, or high (destructive);
//   - execution: sync and streaming (progress notifications become
//     chunks), cancellable (an MCP cancel), retry supported when safe.
//
// MCP's defaults apply to missing hints (readOnlyHint false,
// destructiveHint true, idempotentHint false, openWorldHint true).
func toolCapability(prefix string, t *mcp.Tool) (aip.Capability, toolInfo, error) {
	if t.Name == "" {
		return aip.Capability{}, toolInfo{}, fmt.Errorf("a tool has no name")
	}
	id := prefix + t.Name
	input, err := toolSchema(t.InputSchema)
	if err != nil {
		return aip.Capability{}, toolInfo{}, fmt.Errorf("tool %s inputSchema: %w", t.Name, err)
	}
	if input == nil {
		input = json.RawMessage(`{"type":"object"}`)
	}
	output, err := toolSchema(t.OutputSchema)
	if err != nil {
		return aip.Capability{}, toolInfo{}, fmt.Errorf("tool %s outputSchema: %w", t.Name, err)
	}
	info := toolInfo{name: t.Name, hasOutput: output != nil}
	if output == nil {
		output = defaultToolOutputSchema
	}
	a := t.Annotations
	if a == nil {
		a = &mcp.ToolAnnotations{}
	}
	name := t.Title
	if name == "" {
		name = a.Title
	}
	if name == "" {
		name = t.Name
	}
	destructive := a.DestructiveHint == nil || *a.DestructiveHint
	openWorld := a.OpenWorldHint == nil || *a.OpenWorldHint
	info.readOnly = a.ReadOnlyHint

	var effects []aip.SideEffect
	risk := aip.RiskMedium
	switch {
	case a.ReadOnlyHint:
		effects, risk = []aip.SideEffect{aip.EffectRead}, aip.RiskLow
	case destructive:
		effects, risk = []aip.SideEffect{aip.EffectWrite, aip.EffectDelete}, aip.RiskHigh
	default:
		effects = []aip.SideEffect{aip.EffectWrite}
	}
	if openWorld {
		effects = append(effects, aip.EffectExternalNetwork)
	}
	safe := a.ReadOnlyHint || a.IdempotentHint
	retry := aip.RetryUnsafe
	if safe {
		retry = aip.RetrySafe
	}
	c := aip.Capability{
		ID: id, Name: name, Kind: aip.KindTool, Description: t.Description,
		InputSchema: input, OutputSchema: output, Risk: risk, Stability: aip.StabilityStable,
		Contract: &aip.CapabilityContract{
			SideEffects: effects,
			Idempotency: aip.IdempotencyContract{
				// The host runs an action ID at most once and answers a
				// duplicate with the journaled result.
				Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction,
			},
			Execution: aip.ExecutionContract{
				SupportsSync: true, SupportsStreaming: true, SupportsCancel: true, SupportsRetry: safe,
				ExpectedCompletion: aip.CompletionAny, RetrySafety: retry,
			},
			Data: aip.DataContract{Sensitivity: aip.SensitivityUnknown},
		},
	}
	// Compiled as the host will, so that one unusable tool schema is
	// reported and the tool skipped instead of failing the whole bootstrap.
	if err := hostsdk.CheckCapability(&c); err != nil {
		return aip.Capability{}, toolInfo{}, fmt.Errorf("tool %s: %w", t.Name, err)
	}
	return c, info, nil
}

// toolSchema marshals an MCP schema value (nil when absent); it must be a
// JSON object.
func toolSchema(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("is not a JSON object")
	}
	return raw, nil
}

// toolManifest builds the manifest of an MCP server's tools. Tools outside
// allow (when set) are left out; tools that cannot be described are left
// out and returned in skipped. Capabilities are sorted by ID so a restart
// of the same server yields the same manifest.
func toolManifest(agent aip.Principal, prefix string, allow []string, tools []*mcp.Tool) (*aip.Manifest, map[string]toolInfo, []string) {
	m := &aip.Manifest{ManifestVersion: "aip-manifest/v1", Agent: agent, Profiles: []string{aip.NativeHTTPProfile}}
	infos := make(map[string]toolInfo, len(tools))
	var skipped []string
	for _, t := range tools {
		if len(allow) > 0 && !slices.Contains(allow, t.Name) {
			continue
		}
		c, info, err := toolCapability(prefix, t)
		if err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		if _, dup := infos[c.ID]; dup {
			skipped = append(skipped, fmt.Sprintf("tool %s is listed twice", t.Name))
			continue
		}
		infos[c.ID] = info
		m.Capabilities = append(m.Capabilities, c)
	}
	slices.SortFunc(m.Capabilities, func(a, b aip.Capability) int { return strings.Compare(a.ID, b.ID) })
	return m, infos, skipped
}

// agentFor returns the manifest agent of an MCP server: id (when set) or
// agent:mcp:<server name>.
func agentFor(id string, init *mcp.InitializeResult) aip.Principal {
	name, title := "server", ""
	if init != nil && init.ServerInfo != nil {
		if init.ServerInfo.Name != "" {
			name = init.ServerInfo.Name
		}
		title = init.ServerInfo.Title
	}
	if id == "" {
		id = "agent:mcp:" + name
	}
	if title == "" {
		title = name
	}
	return aip.Principal{ID: id, Kind: aip.PrincipalAgent, DisplayName: title + " (MCP)"}
}
