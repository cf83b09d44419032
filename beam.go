package beam

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/server"
)

// Config is what an embedded directory needs. Zero values are the defaults
// of `beam serve`.
type Config struct {
	// DataDir holds the SQLite log, the operator token and the directory's
	// keys; it is created if missing. Default ./beam-data.
	DataDir string
	// AdminToken is the operator token; empty means the one stored in
	// DataDir/admin.token, generated on first start.
	AdminToken string
	// DefaultPolicy decides who may send to an agent that has no rule for
	// the sender: "same-org" (default), "allow" or "deny".
	DefaultPolicy string
	// AllowLegacyWSIdentity accepts WebSocket sessions without proof of
	// identity, as beam-protocol-sdk 0.5.1 needs. Off by default.
	AllowLegacyWSIdentity bool
	// Domain is the directory's federation domain (e.g.
	// acme.beam.directory); NATSListen starts the embedded NATS server for
	// federation on host:port, or NATSURL joins an existing deployment.
	// Federation is off unless one of the two is set.
	Domain     string
	NATSListen string
	NATSURL    string
	// Peers are the pinned peer directories, as `beam peer show-self`
	// prints them (DOMAIN=nats://HOST:PORT#KEY).
	Peers []string
	// BusAPIKey is the operator bus key for trusted back-ends; empty
	// disables it.
	BusAPIKey string
	// Pipelines, when set, declares pipelines for A2A clients and MCP hosts:
	// the content of a `beam serve --pipelines` file
	// (docs/guides/a2a-mcp.md).
	Pipelines []byte
	// NoLimits turns off the rate limits and connection caps beam serve
	// applies by default (docs/SECURITY.md, "Limits"), e.g. for load tests.
	NoLimits bool
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the time source; nil means time.Now.
	Clock func() time.Time
}

// Server is a directory built by New. It answers HTTP once Serve is called.
type Server struct {
	s *server.Server
}

// New opens (or creates) the directory in cfg.DataDir: it opens the event
// log, runs startup recovery and, with federation configured, joins its
// peers. It does not listen; call Serve.
func New(ctx context.Context, cfg Config) (*Server, error) {
	peers := make([]federation.Peer, 0, len(cfg.Peers))
	for _, line := range cfg.Peers {
		p, err := federation.ParsePeerLine(line)
		if err != nil {
			return nil, fmt.Errorf("beam: peer %q: %w", line, err)
		}
		peers = append(peers, p)
	}
	var pipes []mesh.Pipeline
	if len(cfg.Pipelines) > 0 {
		var err error
		if pipes, err = mesh.ParsePipelines(cfg.Pipelines); err != nil {
			return nil, fmt.Errorf("beam: %w", err)
		}
	}
	lim := server.DefaultLimits
	if cfg.NoLimits {
		lim = server.Limits{ReadTimeout: lim.ReadTimeout, IdleTimeout: lim.IdleTimeout}
	}
	s, err := server.New(ctx, server.Config{
		Limits:                lim,
		DataDir:               cfg.DataDir,
		AdminToken:            cfg.AdminToken,
		DefaultPolicy:         cfg.DefaultPolicy,
		AllowLegacyWSIdentity: cfg.AllowLegacyWSIdentity,
		Domain:                cfg.Domain,
		NATSListen:            cfg.NATSListen,
		NATSURL:               cfg.NATSURL,
		Peers:                 peers,
		BusAPIKey:             cfg.BusAPIKey,
		Pipelines:             pipes,
		Logger:                cfg.Logger,
		Clock:                 cfg.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("beam: %w", err)
	}
	return &Server{s: s}, nil
}

// Serve answers HTTP and WebSocket requests on ln until Shutdown; it
// returns nil after a graceful shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.s.Serve(ln) }

// Shutdown stops accepting requests, waits for those in flight (bounded by
// ctx), commits everything accepted and closes the data directory.
func (s *Server) Shutdown(ctx context.Context) error { return s.s.Shutdown(ctx) }

// Handler is the directory's HTTP handler, for programs that serve it
// behind their own http.Server or mux.
func (s *Server) Handler() http.Handler { return s.s.Handler() }

// AdminToken returns the operator token, and whether this start generated
// it (so a program can show it once).
func (s *Server) AdminToken() (token string, generated bool) { return s.s.AdminToken() }
