//lint:file-ignore SA1019 MCP deprecated sampling and roots (SEP-2577), which servers still ask for and the bridge must answer.

package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aipfleet/aipfleet/aip"
)

// Bounds of MCP's multi round-trip requests, as the Go SDK's own loop
// has them: input_required rounds of one tools/call, and those without
// any input request in a row (the server shedding load).
const (
	maxInputRounds = 10
	maxShedRounds  = 3
)

// callTool is a tools/call, with MCP's multi round-trip requests
// (protocol 2026-07-28, SEP-2322) answered by the bridge rather than the
// SDK: while the server answers input_required, the call is sent again
// with the responses to its input requests. The bridge has no user and no
// model, so:
//
//   - user input (elicitation) is answered cancel, as a client whose user
//     dismissed the request without choosing answers it ("decline" would
//     say a user refused); the server learns it and its tool says what it
//     did, and asked records it, to name it in a failure;
//   - sampling (a model's completion) cannot be answered: the call is
//     abandoned with an interactionError (the SDK's own loop failed it as
//     "client does not support CreateMessage", which the bridge took for
//     the server refusing the call);
//   - roots are answered with none.
//
// A server that keeps asking (maxInputRounds) is given up the same way.
func (m *MCP) callTool(ctx context.Context, sess *mcp.ClientSession, params *mcp.CallToolParams, asked *interaction, log *slog.Logger) (*mcp.CallToolResult, error) {
	p := *params // a round's responses never go into the caller's params
	shed := 0
	for round := 1; ; round++ {
		res, err := sess.CallTool(ctx, &p)
		if err != nil || !res.NeedsInput() {
			return res, err
		}
		if len(res.InputRequests) == 0 {
			// Load shedding: the server asks for nothing, only to be
			// asked again.
			if shed++; shed >= maxShedRounds {
				return nil, fmt.Errorf("tools/call %s: the MCP server answered input_required without any input request %d times in a row (busy)", params.Name, shed)
			}
			continue
		}
		shed = 0
		if round >= maxInputRounds {
			return nil, &interactionError{tool: params.Name, what: fmt.Sprintf("input %d times in a row although the bridge answered each request", round), asked: asked}
		}
		for _, ir := range res.InputRequests {
			switch ir.(type) {
			case *mcp.CreateMessageParams, *mcp.CreateMessageWithToolsParams:
				return nil, &interactionError{tool: params.Name, what: "sampling (a model's completion)", asked: asked}
			case *mcp.ElicitParams, *mcp.ListRootsParams:
			default:
				return nil, &interactionError{tool: params.Name, what: fmt.Sprintf("input the bridge does not know (%T)", ir), asked: asked}
			}
		}
		responses := make(mcp.InputResponseMap, len(res.InputRequests))
		for id, ir := range res.InputRequests {
			switch r := ir.(type) {
			case *mcp.ElicitParams:
				asked.elicited(r.Message)
				if log != nil {
					log.Warn("the MCP tool asked for user input (elicitation); the bridge has no user and answered cancel",
						"tool", params.Name, "message", aip.TruncateUTF8(r.Message, 200))
				}
				responses[id] = &mcp.ElicitResult{Action: "cancel"}
			case *mcp.ListRootsParams:
				responses[id] = &mcp.ListRootsResult{Roots: []*mcp.Root{}}
			}
		}
		p.InputResponses, p.RequestState = responses, res.RequestState
	}
}

// interaction records the user input a tools/call asked for, which the
// bridge answered cancel.
type interaction struct {
	mu       sync.Mutex
	messages []string
}

func (i *interaction) elicited(msg string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.messages = append(i.messages, msg)
}

// note says what the tool asked for and how the bridge answered ("" when
// it asked for nothing).
func (i *interaction) note() string {
	if i == nil {
		return ""
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if len(i.messages) == 0 {
		return ""
	}
	q := make([]string, len(i.messages))
	for n, msg := range i.messages {
		q[n] = fmt.Sprintf("%q", aip.TruncateUTF8(msg, 200))
	}
	return fmt.Sprintf("the tool asked for user input (elicitation: %s), which the AIP bridge cannot give: it has no user, and answered cancel", strings.Join(q, ", "))
}

// explain is a failure's message followed by what the tool asked for (if
// anything), in at most aip.MaxErrorMessageBytes: the cause is kept when
// the message is long.
func (i *interaction) explain(msg string) string {
	n := i.note()
	if n == "" {
		return aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes)
	}
	n = " (" + n + ")"
	return aip.TruncateUTF8(msg, max(aip.MaxErrorMessageBytes-len(n), 0)) + aip.TruncateUTF8(n, aip.MaxErrorMessageBytes)
}

// interactionError is a tools/call the bridge abandoned: the server asked
// for what only an interactive MCP client gives.
type interactionError struct {
	tool, what string
	asked      *interaction
}

func (e *interactionError) Error() string {
	msg := fmt.Sprintf("MCP tool %s asked for %s, which the AIP bridge cannot provide: it has no model and no user; the call was abandoned", e.tool, e.what)
	if n := e.asked.note(); n != "" {
		msg += " (" + n + ")"
	}
	return msg
}
