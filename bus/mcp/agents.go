package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/bus/a2a"
	"github.com/beamdir/beam/tracing"
)

// Agent tools: each skill of an agent that opted in (capability a2a) whose
// payload the intent catalog describes is a tool too, named
// <intent>_<agent>_<org>, taking the catalog's payload schema. A call
// sends the intent from the caller as a bus API-key send does.

// maxAgentTools bounds the agent tools of the server.
const maxAgentTools = 1000

// agentWait bounds how long a call waits for the agent's answer.
const agentWait = 60 * time.Second

// refreshEvery bounds how often the agent tools are recomputed (at the
// start of a session).
const refreshEvery = time.Second

type agentTool struct{ beamID, intent string }

// toolName names the tool of intent at beamID.
func toolName(beamID, intent string) string {
	agent, domain, _ := strings.Cut(beamID, "@")
	name := intent + "_" + agent
	if org, ok := strings.CutSuffix(domain, ".beam.directory"); ok {
		name += "_" + org
	}
	return name
}

// refreshAgentTools brings the agent tools up to date with the registry;
// the SDK tells open sessions that the list changed.
func (s *Server) refreshAgentTools() {
	if s.cfg.Registry == nil || s.cfg.Intents == nil || s.cfg.Catalog == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.refreshed) < refreshEvery {
		return
	}
	s.refreshed = time.Now()
	want := map[string]agentTool{}
	schemas := map[string]json.RawMessage{}
	for _, id := range s.cfg.Registry.Find("") {
		a, ok := s.cfg.Registry.Get(id)
		if !ok || a.Visibility == "unlisted" || !slices.Contains(a.Capabilities, a2a.Capability) {
			continue
		}
		for _, c := range a.Capabilities {
			schema, ok := s.cfg.Catalog.Schema(c)
			if c == a2a.Capability || !ok || len(want) >= maxAgentTools {
				continue
			}
			name := toolName(a.BeamID, c)
			if _, pipeline := s.pipes[name]; pipeline {
				continue
			}
			want[name], schemas[name] = agentTool{a.BeamID, c}, schema
		}
	}
	var stale []string
	for name, t := range s.agentTools {
		if w, ok := want[name]; !ok || w != t {
			stale = append(stale, name)
		}
	}
	if len(stale) > 0 {
		s.srv.RemoveTools(stale...)
	}
	for name, t := range want {
		if old, ok := s.agentTools[name]; ok && old == t {
			continue
		}
		s.srv.AddTool(&sdk.Tool{Name: name, Description: fmt.Sprintf("Sends the intent %s to the agent %s and returns its result", t.intent, t.beamID),
			InputSchema: schemas[name]}, s.intentTool(t))
	}
	s.agentTools = want
}

// intentTool sends t's intent from the caller and returns the agent's
// result.
func (s *Server) intentTool(t agentTool) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		if req.Extra == nil || req.Extra.TokenInfo == nil || req.Extra.TokenInfo.UserID == "" {
			return nil, errors.New("unauthenticated call")
		}
		args := req.Params.Arguments
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		nonce, err := s.cfg.Intents.SendAs(ctx, req.Extra.TokenInfo.UserID, t.beamID, t.intent, args)
		var se *bus.SendError
		if errors.As(err, &se) {
			return failure(se.Msg), nil
		}
		if err != nil {
			return nil, fmt.Errorf("send intent: %w", err)
		}
		row, err := s.cfg.Intents.Await(ctx, nonce, agentWait)
		if err != nil {
			return nil, err
		}
		switch row.Status {
		case tracing.Acked:
			res := &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(row.Response)}}}
			res.Meta = sdk.Meta{"beam/nonce": nonce}
			if len(row.Response) > 0 && row.Response[0] == '{' {
				res.StructuredContent = json.RawMessage(row.Response)
			}
			return res, nil
		case tracing.Failed, tracing.DeadLetter:
			return failure(fmt.Sprintf("intent %s %s: %s", nonce, row.Status, row.Error)), nil
		default:
			return failure(fmt.Sprintf("intent %s is still %s after %s; the bus delivers it when the agent connects", nonce, row.Status, agentWait)), nil
		}
	}
}
