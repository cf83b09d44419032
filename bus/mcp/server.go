package mcp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus/a2a"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/buildinfo"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Config configures New.
type Config struct {
	Mesh      *mesh.Engine
	Pipelines []mesh.Pipeline
	Logger    *slog.Logger
	// AllowCreator rate-limits the calls of an agent; nil allows all.
	AllowCreator func(beamID string) (bool, time.Duration)
	// SessionTimeout closes a session idle this long (10 minutes).
	SessionTimeout time.Duration
	// Registry, Intents and Catalog, when all set, add the tools of opted-in
	// agents' intents that the catalog describes (agents.go).
	Registry *registry.Registry
	Intents  a2a.Intents
	Catalog  *directory.Catalog
}

// Server is the MCP endpoint.
type Server struct {
	cfg   Config
	lg    *slog.Logger
	h     http.Handler
	srv   *sdk.Server
	pipes map[string]bool

	mu         sync.Mutex
	refreshed  time.Time
	agentTools map[string]agentTool
}

// New builds the MCP server with one tool per pipeline.
func New(cfg Config) (*Server, error) {
	if cfg.Mesh == nil {
		return nil, errors.New("mcp: new: mesh is required")
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.SessionTimeout = cmp.Or(cfg.SessionTimeout, 10*time.Minute)
	s := &Server{cfg: cfg, lg: cfg.Logger.With("component", "mcp"), pipes: map[string]bool{}}
	srv := sdk.NewServer(&sdk.Implementation{Name: "beam", Title: "beam directory pipelines", Version: buildinfo.Version},
		&sdk.ServerOptions{Logger: s.lg, Instructions: "Each tool runs a pipeline of agents of this directory; its result is the pipeline's final payload."})
	for i := range cfg.Pipelines {
		p := &cfg.Pipelines[i]
		desc := p.Description
		if desc == "" {
			desc = "Runs the pipeline " + p.Name
		}
		srv.AddTool(&sdk.Tool{Name: p.Name, Description: desc, InputSchema: p.InputSchema}, s.tool(p))
		s.pipes[p.Name] = true
	}
	s.srv = srv
	stream := sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
			s.refreshAgentTools() // a new session sees the agents as they are now
		}
		return srv
	},
		&sdk.StreamableHTTPOptions{Logger: s.lg, SessionTimeout: cfg.SessionTimeout})
	// The token info names the calling agent; the SDK then refuses a
	// session used by another agent than the one that opened it.
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		caller, err := cfg.Mesh.Caller(r)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
		}
		return &auth.TokenInfo{UserID: caller}, nil
	}
	bearer := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(stream)
	s.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Unauthenticated requests get the Beam 401 with the bearer
		// scheme (the SDK's middleware names no scheme without OAuth
		// metadata).
		if _, err := cfg.Mesh.Caller(r); err != nil {
			mesh.Unauthorized(w, err)
			return
		}
		// A tool call's answer streams as long as its envelope runs (its
		// own deadline bounds it); the server's write deadline would cut it.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		bearer.ServeHTTP(w, r)
	})
	return s, nil
}

// Routes mounts the Streamable HTTP endpoint at /mcp.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.Handle("/mcp", s.h)
}

// tool runs pipeline p for one call.
func (s *Server) tool(p *mesh.Pipeline) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		if req.Extra == nil || req.Extra.TokenInfo == nil || req.Extra.TokenInfo.UserID == "" {
			return nil, errors.New("unauthenticated call")
		}
		caller := req.Extra.TokenInfo.UserID
		args := req.Params.Arguments
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		if s.cfg.AllowCreator != nil {
			if ok, _ := s.cfg.AllowCreator(caller); !ok {
				return failure("too many calls from " + caller + "; retry later"), nil
			}
		}
		if err := p.CheckInput(args); err != nil {
			return failure(err.Error()), nil
		}
		if err := s.cfg.Mesh.MayStart(caller, p.Route); err != nil {
			return failure(err.Error()), nil
		}
		row, err := s.cfg.Mesh.CreateLimited(ctx, mesh.CreateRequest{Creator: caller, Route: p.Route, Payload: args,
			Headers: map[string]string{wire.HeaderProtocol: "mcp", wire.HeaderPipeline: p.Name}})
		if err != nil {
			var ie *httpjson.Error
			if errors.As(err, &ie) {
				return failure(ie.Message), nil
			}
			return nil, fmt.Errorf("create envelope: %w", err)
		}
		token := req.Params.GetProgressToken()
		last := 0.0
		report := func(r tracing.MeshRow) {
			if token == nil || r.Progress <= last {
				return
			}
			last = r.Progress
			msg := fmt.Sprintf("hop %d done", r.Hop)
			if !r.Status.Terminal() && r.Actor != "" {
				msg = fmt.Sprintf("hop %d done; next %s", r.Hop, r.Actor)
			}
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: token, Progress: r.Progress, Total: 100, Message: msg}); err != nil {
				s.lg.Debug("progress notification", "envelope", r.ID, "err", err)
			}
		}
		id := row.ID
		row, err = s.cfg.Mesh.Follow(ctx, id, func(r tracing.MeshRow) bool {
			report(r)
			return r.Status.Terminal()
		})
		if err != nil {
			// The client cancelled the call or went away: the envelope
			// ends with it.
			if _, cerr := s.cfg.Mesh.Cancel(context.WithoutCancel(ctx), id); cerr != nil {
				s.lg.Debug("cancel envelope of an abandoned call", "envelope", id, "err", cerr)
			}
			return nil, err
		}
		return resultOf(row), nil
	}
}

// resultOf is the tool result of a finished envelope: the final payload as
// structured content (and as text), or an error result naming why it
// failed or was canceled.
func resultOf(row tracing.MeshRow) *sdk.CallToolResult {
	if row.Status != tracing.MeshSucceeded {
		msg := fmt.Sprintf("envelope %s %s", row.ID, row.Status)
		if row.Reason != "" {
			msg += ": " + row.Reason
		}
		if row.Error != "" {
			msg += ": " + row.Error
		}
		return failure(msg)
	}
	payload, _, err := mesh.Payload(row)
	if err != nil {
		return failure("the final payload is unreadable")
	}
	res := &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(payload)}}}
	res.Meta = sdk.Meta{"beam/envelope": row.ID}
	if len(payload) > 0 && payload[0] == '{' {
		res.StructuredContent = payload
	}
	return res
}

func failure(msg string) *sdk.CallToolResult {
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: msg}}}
}
