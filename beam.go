package beam

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/limits"
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
	// nil means DefaultLimits() (docs/SECURITY.md, "Limits"). A zero field
	// of a non-nil Limits turns that limit off: start from DefaultLimits().
	Limits *Limits
	// NoLimits turns off the rate limits and connection caps, keeping
	// Limits' ReadTimeout, IdleTimeout and ReadHeaderTimeout, e.g. for load
	// tests. Off by default.
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
	// TakeoverGrace is how long a node must have been gone (past the
	// expiry of its entry in the nodes bucket) before a surviving node
	// takes over its log and unfinished work; 0 means
	// cluster.DefaultTakeoverGrace (5 s). A longer grace lets a node be down longer and
	// resume its own work (a slow restart, an upgrade), at the price of
	// that work waiting as long when the node does not come back.
	TakeoverGrace time.Duration
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
// The zero value of a Rate, a cap or a timeout disables it, so change the
// defaults rather than starting from an empty Limits:
//
//	lim := beam.DefaultLimits()
//	lim.Register = beam.Rate{N: 10, Per: time.Minute}
//	cfg.Limits = &lim
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
	// ReadHeaderTimeout bounds reading a request's headers; 0 means 10s,
	// so a client cannot hold a connection by sending its headers slowly
	// even with the other limits off.
	ReadHeaderTimeout time.Duration
	// JobBusMaxConns caps open connections to the job bus (1024).
	JobBusMaxConns int
	// JobBusMaxConnsPerAddr caps open job bus connections per client
	// address (64).
	JobBusMaxConnsPerAddr int
	// JobBusIdleTimeout closes a job bus connection that waits longer for
	// its next request (or, when new, for its first request's headers, at
	// most 10s); 0 means 120s.
	JobBusIdleTimeout time.Duration
}

// DefaultLimits are the limits of `beam serve` and of a Config whose
// Limits is nil.
func DefaultLimits() Limits {
	return Limits{
		Register: Rate{N: 30, Per: time.Minute},
		Connect:  Rate{N: 120, Per: time.Minute},
		Intents:  Rate{N: 1200, Per: time.Minute},
		BusSends: Rate{N: 1200, Per: time.Minute},
		// Pipelines: each envelope may wait up to a day for its actors.
		MeshCreates:        Rate{N: 600, Per: time.Minute},
		MeshOpenPerCreator: 1000,
		MaxConns:           4096,
		MaxConnsPerAddr:    256,
		ReadTimeout:        30 * time.Second,
		WriteTimeout:       0, // derived from the result timeouts, see writeTimeout
		IdleTimeout:        120 * time.Second,

		JobBusMaxConns:        1024,
		JobBusMaxConnsPerAddr: 64,
		JobBusIdleTimeout:     120 * time.Second,
	}
}

// parsed is what New reads out of the Config's text fields.
type parsed struct {
	peers        []federation.Peer
	catalog      *directory.Catalog
	pipelines    []mesh.Pipeline
	meshPolicies map[string]mesh.Policy
	meshDefault  mesh.Policy
}

// parse reads cfg's peer lines, intent catalog, pipelines and pipeline
// policies; the errors name the setting.
func (cfg *Config) parse() (parsed, error) {
	var p parsed
	for _, line := range cfg.Federation.Peers {
		peer, err := federation.ParsePeerLine(line)
		if err != nil {
			return parsed{}, fmt.Errorf("peer %q: %w", line, err)
		}
		p.peers = append(p.peers, peer)
	}
	var err error
	if len(cfg.IntentCatalog) > 0 {
		if p.catalog, err = directory.ParseCatalog(cfg.IntentCatalog); err != nil {
			return parsed{}, fmt.Errorf("intent catalog: %w", err)
		}
	}
	if len(cfg.Pipelines.Declared) > 0 {
		if p.pipelines, err = mesh.ParsePipelines(cfg.Pipelines.Declared); err != nil {
			return parsed{}, err
		}
	}
	if len(cfg.Pipelines.Policies) > 0 {
		pols, err := mesh.ParsePolicyFile(cfg.Pipelines.Policies)
		if err != nil {
			return parsed{}, err
		}
		p.meshPolicies = pols.Actors
		if pols.Default != nil {
			p.meshDefault = *pols.Default
		}
	}
	return p, nil
}

// limits are the limits cfg puts in force: Limits, DefaultLimits() when
// it is nil, and with NoLimits only the read and idle timeouts.
func (cfg *Config) limits() Limits {
	lim := DefaultLimits()
	if cfg.Limits != nil {
		lim = *cfg.Limits
	}
	if cfg.NoLimits {
		lim = Limits{ReadTimeout: lim.ReadTimeout, IdleTimeout: lim.IdleTimeout, ReadHeaderTimeout: lim.ReadHeaderTimeout}
	}
	return lim
}

// JobBusSecret returns the job bus's BUS_SECRET, which its clients send as
// X-API-KEY, and whether this start generated it; empty when the job bus
// is off.
func (s *Server) JobBusSecret() (secret string, generated bool) {
	if s.intent == nil {
		return "", false
	}
	return s.intent.secret, s.intent.secretIsNew
}

// PeerLine is the line peers pin this directory with
// (DOMAIN=nats://HOST:PORT#KEY, as `beam peer show-self` prints it), or
// empty when federation is off.
func (s *Server) PeerLine() string {
	if s.fed == nil {
		return ""
	}
	return s.fed.Self().Line()
}
