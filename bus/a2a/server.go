package a2a

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Config configures New.
type Config struct {
	Mesh      *mesh.Engine
	Registry  *registry.Registry
	Pipelines []mesh.Pipeline
	// Intents sends the intents of messages to opted-in agents (the
	// message bus); nil serves no agents.
	Intents Intents
	// AllowCreator rate-limits the tasks an agent creates on pipelines; nil
	// allows all.
	AllowCreator func(beamID string) (bool, time.Duration)
	// Name is the directory's name on its card (its domain).
	Name   string
	Logger *slog.Logger
	// KeepaliveInterval is how often an idle stream gets a comment (15 s).
	KeepaliveInterval time.Duration
	// Log stores the tasks' push notification configs (a table written
	// through its writer); nil keeps them in memory only.
	Log *tracing.Log
	// AllowPrivateWebhooks lets push notifications go to http:// loopback
	// URLs and to loopback, private and link-local addresses
	// (--allow-private-endpoints: local development only).
	AllowPrivateWebhooks bool
}

// Server answers A2A requests. It is safe for concurrent use.
type Server struct {
	cfg   Config
	pipes map[string]*mesh.Pipeline
	lg    *slog.Logger
	push  *pushes
}

// New builds a server for cfg's pipelines.
func New(cfg Config) (*Server, error) {
	if cfg.Mesh == nil || cfg.Registry == nil {
		return nil, errors.New("a2a: new: mesh and registry are required")
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.KeepaliveInterval = cmp.Or(cfg.KeepaliveInterval, 15*time.Second)
	cfg.Name = cmp.Or(cfg.Name, "beam.directory")
	s := &Server{cfg: cfg, pipes: map[string]*mesh.Pipeline{}, lg: cfg.Logger.With("component", "a2a")}
	for i := range cfg.Pipelines {
		s.pipes[cfg.Pipelines[i].Name] = &cfg.Pipelines[i]
	}
	if err := s.openPushes(); err != nil {
		return nil, fmt.Errorf("a2a: %w", err)
	}
	return s, nil
}

// Routes mounts the cards, the JSON-RPC endpoints and the HTTP+JSON
// binding.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /.well-known/agent-card.json", s.handleDirectoryCard)
	api := httpjson.Adapter{Log: s.lg}
	mux.HandleFunc("GET /a2a/pipelines/{name}/.well-known/agent-card.json", api.Handler(s.handlePipelineCard))
	mux.HandleFunc("POST /a2a", api.Handler(s.handleRPC))
	mux.HandleFunc("POST /a2a/pipelines/{name}", api.Handler(s.handleRPC))
	mux.HandleFunc("POST /a2a/pipelines/{name}/message:send", s.handleRESTSend)
	mux.HandleFunc("POST /a2a/pipelines/{name}/message:stream", s.handleRESTStream)
	mux.HandleFunc("GET /a2a/pipelines/{name}/tasks", s.handleRESTList)
	mux.HandleFunc("GET /a2a/pipelines/{name}/tasks/{task}", s.handleRESTTask)
	mux.HandleFunc("POST /a2a/pipelines/{name}/tasks/{task}", s.handleRESTTask)
	mux.HandleFunc("GET /a2a/agents/{beamId}/.well-known/agent-card.json", api.Handler(s.handleAgentCard))
	mux.HandleFunc("POST /a2a/agents/{beamId}", api.Handler(s.handleAgentRPC))
	mux.HandleFunc("POST /a2a/pipelines/{name}/tasks/{task}/pushNotificationConfigs", s.handleRESTPush)
	mux.HandleFunc("GET /a2a/pipelines/{name}/tasks/{task}/pushNotificationConfigs", s.handleRESTPush)
	mux.HandleFunc("GET /a2a/pipelines/{name}/tasks/{task}/pushNotificationConfigs/{config}", s.handleRESTPush)
	mux.HandleFunc("DELETE /a2a/pipelines/{name}/tasks/{task}/pushNotificationConfigs/{config}", s.handleRESTPush)
	mux.HandleFunc("POST /a2a/tasks/{task}/pushNotificationConfigs", s.handleRESTPush)
	mux.HandleFunc("GET /a2a/tasks/{task}/pushNotificationConfigs", s.handleRESTPush)
	mux.HandleFunc("GET /a2a/tasks/{task}/pushNotificationConfigs/{config}", s.handleRESTPush)
	mux.HandleFunc("DELETE /a2a/tasks/{task}/pushNotificationConfigs/{config}", s.handleRESTPush)
	mux.HandleFunc("GET /a2a/tasks", s.handleRESTList)
	mux.HandleFunc("GET /a2a/tasks/{task}", s.handleRESTTask)
	mux.HandleFunc("POST /a2a/tasks/{task}", s.handleRESTTask)
}

// scheme is the card's security scheme name.
const scheme = "bearer"

// caller authenticates r as an agent (mesh.Engine.Caller).
func (s *Server) caller(r *http.Request) (string, error) { return s.cfg.Mesh.Caller(r) }

// pipeline returns the pipeline r's {name} names, or nil for the
// directory-wide endpoints.
func (s *Server) pipeline(r *http.Request) (*mesh.Pipeline, bool) {
	name := r.PathValue("name")
	if name == "" {
		return nil, true
	}
	p, ok := s.pipes[name]
	return p, ok
}

// baseURL is the scheme and host the client reached the directory at.
func baseURL(r *http.Request) string {
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	if f := r.Header.Get("X-Forwarded-Proto"); f == "https" || f == "http" {
		proto = f
	}
	return proto + "://" + r.Host
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ctxErr reports whether err is a context's end.
func ctxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
