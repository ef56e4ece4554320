//lint:file-ignore SA1019 MCP deprecated sampling and roots (SEP-2577), which servers still ask for and the bridge must answer.

package sidecar

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// addInteractiveTools adds tools that need what only an interactive MCP
// client gives: confirm (not read-only) asks for user input
// (elicitation) and fails unless it was accepted; summarize and
// summarize_ro ask for sampling. They ask as MCP's multi round-trip
// requests do (an input_required result); with a client of an older
// protocol the SDK sends the requests itself (elicitation/create,
// sampling/createMessage).
func addInteractiveTools(server *mcp.Server) {
	text := func(s string, isErr bool) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}, IsError: isErr}
	}
	server.AddTool(&mcp.Tool{Name: "confirm", InputSchema: objectSchema},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if r, ok := req.Params.InputResponses["ok"].(*mcp.ElicitResult); ok {
				if r.Action != "accept" {
					return text("not confirmed ("+r.Action+"); nothing was deleted", true), nil
				}
				return text("deleted", false), nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"ok": &mcp.ElicitParams{
				Message: "Delete everything?", RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
			}}}, nil
		})
	summarize := func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if _, ok := req.Params.InputResponses["llm"]; ok {
			return text("summarized", false), nil
		}
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"llm": &mcp.CreateMessageParams{
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "summarize this"}}}, MaxTokens: 10,
		}}}, nil
	}
	server.AddTool(&mcp.Tool{Name: "summarize", InputSchema: objectSchema}, summarize)
	server.AddTool(&mcp.Tool{Name: "summarize_ro", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, summarize)
}

// TestMCPToolNeedingUserInput: a tool that asks for user input
// (elicitation) is answered cancel — no user is present — and its own
// answer says what it did, with the cause named; a tool that needs
// sampling cannot be served (the bridge has no model and no user): a read
// fails mcp.interaction_unavailable, not retryable, and any other call's
// outcome is unknown when the server only learns of it by the call being
// abandoned (protocol 2026-07-28), or is the server's answer to the
// bridge's refusal (2025-11-25). The SDK refused both as a client without
// the feature, and the bridge took that for the server refusing the call
// (mcp.error, permanent: not run).
func TestMCPToolNeedingUserInput(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "input_required"
		var env []string
		if legacy {
			name, env = "server requests", []string{envMCPLegacy + "=1"}
		}
		t.Run(name, func(t *testing.T) {
			m, _, man := connectRestartingStdioMCP(t, env...)
			ctx := ctxT(t)
			res, err := m.Handle(ctx, toolCall(t, man, "confirm", `{}`))
			if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != CodeToolError ||
				!strings.Contains(res.Error.Message, "not confirmed (cancel); nothing was deleted") {
				t.Errorf("confirm: %+v, %v; want the tool's own failure after the bridge answered cancel", res, err)
			} else if !legacy && !strings.Contains(res.Error.Message, `"Delete everything?"`) {
				t.Errorf("confirm: %q does not name the user input the tool asked for", res.Error.Message)
			}
			_, err = m.Handle(ctx, toolCall(t, man, "summarize_ro", `{}`))
			var pe *aip.ProtocolError
			switch {
			case !legacy && (!errors.As(err, &pe) || pe.Code != CodeInteractionUnavailable || pe.IsRetryable() || !strings.Contains(pe.Message, "sampling")):
				t.Errorf("summarize_ro: %v; want %s naming sampling, not retryable", err, CodeInteractionUnavailable)
			case legacy && (!errors.As(err, &pe) || pe.IsRetryable() || !strings.Contains(pe.Message, "no model and no user")):
				t.Errorf("summarize_ro: %v; want the server's failure after the bridge's refusal, which names it", err)
			}
			_, err = m.Handle(ctx, toolCall(t, man, "summarize", `{}`))
			if !errors.Is(err, hostsdk.ErrOutcomeUnknown) || !strings.Contains(err.Error(), map[bool]string{false: "sampling", true: "no model and no user"}[legacy]) {
				t.Errorf("summarize: %v; want outcome unknown naming sampling", err)
			}
		})
	}
}
