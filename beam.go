package beam

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/limits"
	"github.com/beamdir/beam/internal/server"
)

// Config is what an embedded directory needs; `beam serve` builds one from
// its flags. Zero values are the defaults of `beam serve`, but for the job
// bus, which serve runs on a port of its own and an embedder turns on with
// JobBus.Enabled.
type Config struct {
	// DataDir holds the SQLite log, the operator token and the directory's
	// keys; it is created if missing. Default ./beam-data.
	DataDir string
	// Synchronous is the SQLite synchronous mode: "FULL" (default, every
	// commit fsynced) or "NORMAL".
	Synchronous string
	// AdminToken is the operator token; empty means the one stored in
	// DataDir/admin.token, generated on first start.
	AdminToken string
	// ViewerToken signs in to the dashboard read-only; empty means the one
	// stored in DataDir/viewer.token, generated on first start.
	ViewerToken string
	// SecureCookies marks dashboard session cookies Secure, for a
	// directory served over HTTPS. Off by default.
	SecureCookies bool
	// DefaultPolicy decides who may send to an agent that has no rule for
	// the sender: "same-org" (default), "allow" or "deny".
	DefaultPolicy string
	// AllowLegacyWSIdentity accepts WebSocket sessions without proof of
	// identity, as beam-protocol-sdk 0.5.1 needs. Off by default.
	AllowLegacyWSIdentity bool
	// AllowInsecureEndpoints lets agents register http:// loopback
	// endpoints for direct delivery (local development). Off by default.
	AllowInsecureEndpoints bool
	// AllowPrivateEndpoints lets direct HTTP delivery reach loopback,
	// private and link-local addresses (local development). Off by
	// default: agents' endpoints must be public.
	AllowPrivateEndpoints bool
	// OpenOrgs makes every registrant of an org an approved member at
	// once. Off by default: the org's first registrant or an operator
	// approves members.
	OpenOrgs bool
	// Domain is the domain the directory serves: Beam IDs register only in
	// it and the orgs beneath it, and it is the federation domain (e.g.
	// acme.beam.directory). Empty means beam.directory: personal IDs and
	// every org, and no federation.
	Domain string
	// IntentCatalog, when set, is a JSON catalog of intent types with
	// payload schemas (the content of a `beam serve --intent-catalog`
	// file); other intent types are then refused. Empty accepts any intent
	// type.
	IntentCatalog []byte

	// Federation links the directory to its peers over NATS.
	Federation Federation
	// Cluster serves Domain as one node of a cluster.
	Cluster Cluster
	// Bus tunes the durable message bus.
	Bus Bus
	// JobBus runs the Intent Protocol v2.1 job bus; serve it with
	// Server.ServeJobBus.
	JobBus JobBus
	// Pipelines declares pipelines and their retry policies.
	Pipelines Pipelines
	// Timeouts bound waits for intents' results.
	Timeouts Timeouts
	// Limits are the rate limits, connection caps and request timeouts;
	// nil means DefaultLimits() (docs/SECURITY.md, "Limits").
	Limits *Limits
	// NoLimits turns off the rate limits and connection caps, keeping
	// Limits' ReadTimeout and IdleTimeout, e.g. for load tests. Off by
	// default.
	NoLimits bool

	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the time source; nil means time.Now.
	Clock func() time.Time
}

// Federation links a directory to peer directories over NATS. It is off
// unless Config.Domain and one of NATSListen or NATSURL are set.
type Federation struct {
	// NATSListen starts the embedded NATS server on host:port. Empty by
	// default.
	NATSListen string
	// NATSURL joins an existing NATS deployment instead. Empty by default.
	NATSURL string
	// Peers are the pinned peer directories, as `beam peer show-self`
	// prints them (DOMAIN=nats://HOST:PORT#KEY). None by default.
	Peers []string
}

// Cluster makes the directory one node of a cluster serving Config.Domain
// (federation/cluster). Off by default.
type Cluster struct {
	// Enabled turns cluster mode on; it needs Config.Domain and, with
	// embedded NATS servers, the route credentials `beam cluster init`
	// writes into the data directory.
	Enabled bool
	// NodeID names this node (a-z, 0-9, '-'); empty means an ID generated
	// once and kept in the data directory.
	NodeID string
	// Listen is the route listener (host:port) of the embedded NATS
	// server, which the other nodes' Routes name. Empty by default.
	Listen string
	// Routes are the other nodes' route URLs (nats-route://host:port).
	Routes []string
	// Replicas of the cluster's JetStream streams; 0 means min(3, nodes).
	Replicas int
}

// Bus tunes the durable message bus (package bus).
type Bus struct {
	// APIKey is the operator bus key for trusted back-ends (sent as
	// Authorization: Bearer); empty disables it.
	APIKey string
	// RetrySchedule are the delays after each failed attempt, the last
	// repeating, each with ±15% jitter; nil means 30s, 60s, 120s, 240s.
	RetrySchedule []time.Duration
	// MaxAttempts are the delivery attempts before a message is
	// dead-lettered; 0 means 5.
	MaxAttempts int
	// DeliveryTimeout bounds one delivery's wait for the recipient's
	// result; 0 means 30s.
	DeliveryTimeout time.Duration
	// TickInterval is how often due messages are retried and poll leases
	// expired; 0 means 1s.
	TickInterval time.Duration
}

// JobBus is the Intent Protocol v2.1 job bus (package bus/jobs), served on
// its own listener by Server.ServeJobBus. Off by default.
type JobBus struct {
	// Enabled runs the job bus on the directory's log.
	Enabled bool
	// Settings are the job bus's settings (jobs.ConfigFromEnv reads them
	// from the BUS_* variables); zero values are its defaults. Its Log is
	// filled in, and an empty Secret is replaced by one generated once and
	// kept in DataDir/intent.secret (Server.JobBusSecret).
	Settings jobs.Config
}

// Pipelines are Asya-style pipelines (package bus/mesh).
type Pipelines struct {
	// Declared, when set, declares pipelines served as A2A agents and MCP
	// tools: the content of a `beam serve --pipelines` file
	// (docs/guides/a2a-mcp.md). None by default.
	Declared []byte
	// Policies, when set, are the retry policies of the pipelines' actors:
	// the content of a `beam serve --mesh-policies` file ({"default":
	// {...}, "actors": {"<beam id>": {...}}}). Default: one attempt.
	Policies []byte
	// HopTimeout bounds one hop's wait for its actor; 0 means 30s.
	HopTimeout time.Duration
}

// Timeouts bound the waits for intents' results; zero values are the
// defaults.
type Timeouts struct {
	// WebSocket is the result timeout of intents sent over WebSocket;
	// 0 means 30s.
	WebSocket time.Duration
	// HTTP is the result timeout of POST /intents/send; 0 means 60s.
	HTTP time.Duration
	// Relay is the timeout recovery assumes, after a restart, for a
	// delivered intent that stored none; 0 means 30s.
	Relay time.Duration
	// RecoverySweep is how often intents recovered as delivered are
	// checked for expiry; 0 means 5s.
	RecoverySweep time.Duration
}

// Rate is N events per Per, in bursts of up to N; the zero Rate is no
// limit.
type Rate struct {
	// N is how many events a key may have per Per, and its burst.
	N int
	// Per is the period N events are spread over.
	Per time.Duration
}

// String is the rate as `beam serve`'s --limit-* flags take it: N/DURATION,
// or "off".
func (r Rate) String() string { return limits.Rate(r).String() }

// Limits are a directory's resource limits (docs/SECURITY.md, "Limits").
// The zero value of a Rate, a cap or a timeout disables it.
type Limits struct {
	// Register bounds POST /agents/register per client address (30/1m).
	Register Rate
	// Connect bounds WebSocket connects per client address (120/1m).
	Connect Rate
	// Intents bounds intents per sending agent (1200/1m).
	Intents Rate
	// BusSends bounds POST /v1/beam/send per sending agent (1200/1m).
	BusSends Rate
	// MeshCreates bounds POST /api/v1/mesh per creating agent (600/1m).
	MeshCreates Rate
	// MeshOpenPerCreator caps the open pipeline envelopes of one creating
	// agent (1000).
	MeshOpenPerCreator int
	// MaxConns caps open HTTP connections in total (4096).
	MaxConns int
	// MaxConnsPerAddr caps open HTTP connections per client address (256).
	MaxConnsPerAddr int
	// ReadTimeout bounds reading one request's body (30s).
	ReadTimeout time.Duration
	// WriteTimeout bounds one response, streams exempt; 0 means the
	// longest result timeout plus 30s.
	WriteTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections (120s).
	IdleTimeout time.Duration
	// JobBusMaxConns caps open connections to the job bus (1024).
	JobBusMaxConns int
	// JobBusMaxConnsPerAddr caps open job bus connections per client
	// address (64).
	JobBusMaxConnsPerAddr int
	// JobBusIdleTimeout closes a job bus connection that waits longer for
	// its next request (120s).
	JobBusIdleTimeout time.Duration
}

// DefaultLimits are the limits of `beam serve` and of a Config whose
// Limits is nil.
func DefaultLimits() Limits { return fromServerLimits(server.DefaultLimits) }

func fromServerLimits(l server.Limits) Limits {
	return Limits{
		Register: Rate(l.Register), Connect: Rate(l.Connect), Intents: Rate(l.Intents), BusSends: Rate(l.BusSends),
		MeshCreates: Rate(l.MeshCreates), MeshOpenPerCreator: l.MeshOpenPerCreator,
		MaxConns: l.MaxConns, MaxConnsPerAddr: l.MaxConnsPerAddr,
		ReadTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout,
		JobBusMaxConns: l.IntentMaxConns, JobBusMaxConnsPerAddr: l.IntentMaxConnsPerAddr, JobBusIdleTimeout: l.IntentIdleTimeout,
	}
}

func (l Limits) server() server.Limits {
	return server.Limits{
		Register: limits.Rate(l.Register), Connect: limits.Rate(l.Connect), Intents: limits.Rate(l.Intents),
		BusSends: limits.Rate(l.BusSends), MeshCreates: limits.Rate(l.MeshCreates), MeshOpenPerCreator: l.MeshOpenPerCreator,
		MaxConns: l.MaxConns, MaxConnsPerAddr: l.MaxConnsPerAddr,
		ReadTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout,
		IntentMaxConns: l.JobBusMaxConns, IntentMaxConnsPerAddr: l.JobBusMaxConnsPerAddr, IntentIdleTimeout: l.JobBusIdleTimeout,
	}
}

// Server is a directory built by New. It answers HTTP once Serve is called.
type Server struct {
	s *server.Server
}

// New opens (or creates) the directory in cfg.DataDir: it opens the event
// log, runs startup recovery and, with federation configured, joins its
// peers. It does not listen; call Serve (and ServeJobBus).
func New(ctx context.Context, cfg Config) (*Server, error) {
	// Errors come back as the assembly words them: `beam serve` prints
	// them after its own name.
	sc, err := cfg.server()
	if err != nil {
		return nil, err
	}
	s, err := server.New(ctx, sc)
	if err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// server maps cfg onto the assembly's configuration, parsing what it holds
// as text.
func (cfg Config) server() (server.Config, error) {
	peers := make([]federation.Peer, 0, len(cfg.Federation.Peers))
	for _, line := range cfg.Federation.Peers {
		p, err := federation.ParsePeerLine(line)
		if err != nil {
			return server.Config{}, fmt.Errorf("peer %q: %w", line, err)
		}
		peers = append(peers, p)
	}
	var catalog *directory.Catalog
	if len(cfg.IntentCatalog) > 0 {
		var err error
		if catalog, err = directory.ParseCatalog(cfg.IntentCatalog); err != nil {
			return server.Config{}, fmt.Errorf("intent catalog: %w", err)
		}
	}
	var pipes []mesh.Pipeline
	if len(cfg.Pipelines.Declared) > 0 {
		var err error
		if pipes, err = mesh.ParsePipelines(cfg.Pipelines.Declared); err != nil {
			return server.Config{}, err
		}
	}
	var pols mesh.PolicyFile
	if len(cfg.Pipelines.Policies) > 0 {
		var err error
		if pols, err = mesh.ParsePolicyFile(cfg.Pipelines.Policies); err != nil {
			return server.Config{}, err
		}
	}
	var meshDefault mesh.Policy
	if pols.Default != nil {
		meshDefault = *pols.Default
	}
	lim := server.DefaultLimits
	if cfg.Limits != nil {
		lim = cfg.Limits.server()
	}
	if cfg.NoLimits {
		lim = server.Limits{ReadTimeout: lim.ReadTimeout, IdleTimeout: lim.IdleTimeout}
	}
	var jobBus *jobs.Config
	if cfg.JobBus.Enabled {
		c := cfg.JobBus.Settings
		jobBus = &c
	}
	var clusterCfg *server.ClusterConfig
	if c := cfg.Cluster; c.Enabled {
		clusterCfg = &server.ClusterConfig{NodeID: c.NodeID, Listen: c.Listen, Routes: c.Routes, Replicas: c.Replicas}
	}
	return server.Config{
		DataDir:                cfg.DataDir,
		Synchronous:            cfg.Synchronous,
		AdminToken:             cfg.AdminToken,
		ViewerToken:            cfg.ViewerToken,
		SecureCookies:          cfg.SecureCookies,
		DefaultPolicy:          cfg.DefaultPolicy,
		AllowLegacyWSIdentity:  cfg.AllowLegacyWSIdentity,
		AllowInsecureEndpoints: cfg.AllowInsecureEndpoints,
		AllowPrivateEndpoints:  cfg.AllowPrivateEndpoints,
		OpenOrgs:               cfg.OpenOrgs,
		Domain:                 cfg.Domain,
		IntentCatalog:          catalog,
		NATSListen:             cfg.Federation.NATSListen,
		NATSURL:                cfg.Federation.NATSURL,
		Peers:                  peers,
		Cluster:                clusterCfg,
		BusAPIKey:              cfg.Bus.APIKey,
		BusRetrySchedule:       cfg.Bus.RetrySchedule,
		BusMaxAttempts:         cfg.Bus.MaxAttempts,
		BusDeliveryTimeout:     cfg.Bus.DeliveryTimeout,
		BusTickInterval:        cfg.Bus.TickInterval,
		IntentBus:              jobBus,
		Pipelines:              pipes,
		MeshPolicies:           pols.Actors,
		MeshDefaultPolicy:      meshDefault,
		MeshHopTimeout:         cfg.Pipelines.HopTimeout,
		WSTimeout:              cfg.Timeouts.WebSocket,
		HTTPTimeout:            cfg.Timeouts.HTTP,
		RelayTimeout:           cfg.Timeouts.Relay,
		RecoverySweepInterval:  cfg.Timeouts.RecoverySweep,
		Limits:                 lim,
		Logger:                 cfg.Logger,
		Clock:                  cfg.Clock,
	}, nil
}

// Serve answers HTTP and WebSocket requests on ln until Shutdown; it
// returns nil after a graceful shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.s.Serve(ln) }

// ServeJobBus answers the Intent Protocol job bus on ln until Shutdown,
// under Limits' job bus connection caps; it returns nil after a graceful
// shutdown, and an error when Config.JobBus is not enabled.
func (s *Server) ServeJobBus(ln net.Listener) error { return s.s.ServeIntent(ln) }

// Shutdown stops accepting requests, waits for those in flight (bounded by
// ctx), commits everything accepted and closes the data directory.
func (s *Server) Shutdown(ctx context.Context) error { return s.s.Shutdown(ctx) }

// Abandon shuts down a directory that never served, first removing the
// tokens and secrets this start generated: nobody has seen them, and the
// next start generates (and can show) new ones.
func (s *Server) Abandon(ctx context.Context) error { return s.s.Abandon(ctx) }

// Handler is the directory's HTTP handler, for programs that serve it
// behind their own http.Server or mux.
func (s *Server) Handler() http.Handler { return s.s.Handler() }

// AdminToken returns the operator token, and whether this start generated
// it (so a program can show it once).
func (s *Server) AdminToken() (token string, generated bool) { return s.s.AdminToken() }

// ViewerToken returns the read-only dashboard token, and whether this
// start generated it.
func (s *Server) ViewerToken() (token string, generated bool) { return s.s.ViewerToken() }

// JobBusSecret returns the job bus's BUS_SECRET, which its clients send as
// X-API-KEY, and whether this start generated it; empty when the job bus
// is off.
func (s *Server) JobBusSecret() (secret string, generated bool) { return s.s.IntentSecret() }

// PeerLine is the line peers pin this directory with
// (DOMAIN=nats://HOST:PORT#KEY, as `beam peer show-self` prints it), or
// empty when federation is off.
func (s *Server) PeerLine() string {
	node := s.s.Federation()
	if node == nil {
		return ""
	}
	return node.Self().Line()
}
