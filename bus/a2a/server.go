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
	"strings"
	"time"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
)

// Config configures New.
type Config struct {
	Mesh      *mesh.Engine
	Registry  *registry.Registry
	Pipelines []mesh.Pipeline
	// OperatorAuth recognises the operator token; the operator then names
	// the agent it acts for in the X-Beam-Id header.
	OperatorAuth func(*http.Request) bool
	// Name is the directory's name on its card (its domain).
	Name   string
	Logger *slog.Logger
	// KeepaliveInterval is how often an idle stream gets a comment (15 s).
	KeepaliveInterval time.Duration
}

// Server answers A2A requests. It is safe for concurrent use.
type Server struct {
	cfg   Config
	pipes map[string]*mesh.Pipeline
	lg    *slog.Logger
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
	return s, nil
}

// HeaderAgent names the agent an operator request acts for.
const HeaderAgent = "X-Beam-Id"

// Routes mounts the cards, the JSON-RPC endpoints and the HTTP+JSON
// binding.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /.well-known/agent-card.json", s.handleDirectoryCard)
	mux.HandleFunc("GET /a2a/pipelines/{name}/.well-known/agent-card.json", s.handlePipelineCard)
	mux.HandleFunc("POST /a2a", s.handleRPC)
	mux.HandleFunc("POST /a2a/pipelines/{name}", s.handleRPC)
	mux.HandleFunc("POST /a2a/pipelines/{name}/message:send", s.handleRESTSend)
	mux.HandleFunc("POST /a2a/pipelines/{name}/message:stream", s.handleRESTStream)
	mux.HandleFunc("GET /a2a/pipelines/{name}/tasks", s.handleRESTList)
	mux.HandleFunc("GET /a2a/pipelines/{name}/tasks/{task}", s.handleRESTTask)
	mux.HandleFunc("POST /a2a/pipelines/{name}/tasks/{task}", s.handleRESTTask)
	mux.HandleFunc("GET /a2a/tasks", s.handleRESTList)
	mux.HandleFunc("GET /a2a/tasks/{task}", s.handleRESTTask)
	mux.HandleFunc("POST /a2a/tasks/{task}", s.handleRESTTask)
}

// scheme is the card's security scheme name.
const scheme = "bearer"

// errUnauthenticated is answered with 401 and the card's scheme.
var errUnauthenticated = errors.New("send an agent's API key as Authorization: Bearer (or the operator token with X-Beam-Id naming the agent)")

// caller authenticates r: an agent's API key, or the operator token with
// X-Beam-Id naming a registered agent.
func (s *Server) caller(r *http.Request) (string, error) {
	if s.cfg.OperatorAuth != nil && s.cfg.OperatorAuth(r) {
		id := strings.TrimSpace(r.Header.Get(HeaderAgent))
		if _, ok := s.cfg.Registry.Get(id); !ok {
			return "", fmt.Errorf("%w: the operator token acts for the agent named in %s, and %q is not registered", errUnauthenticated, HeaderAgent, id)
		}
		return id, nil
	}
	key, ok := httpjson.APIKey(r)
	if !ok {
		key, _ = httpjson.Bearer(r)
	}
	if key == "" {
		return "", errUnauthenticated
	}
	a, ok := s.cfg.Registry.AuthenticateAPIKey(key)
	if !ok {
		return "", fmt.Errorf("%w: the key is not valid", errUnauthenticated)
	}
	return a.BeamID, nil
}

// unauthorized answers 401 naming the bearer scheme of the card.
func unauthorized(w http.ResponseWriter, err error) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="beam", error="invalid_token"`)
	httpjson.Error(w, http.StatusUnauthorized, "UNAUTHORIZED", err.Error())
}

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
