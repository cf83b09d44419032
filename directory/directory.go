package directory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/directory/attest"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/buildinfo"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/replay"
	"github.com/beamdir/beam/tracing"
)

// Defaults of Config.
const (
	defaultWSTimeout             = 30 * time.Second
	defaultHTTPTimeout           = 60 * time.Second
	defaultDirectHTTPTimeout     = 30 * time.Second
	defaultRelayTimeout          = 30 * time.Second
	defaultRecoverySweepInterval = 5 * time.Second
	defaultMaxFrameBytes         = 4096
	defaultMaxMessageBytes       = 64 << 10
	defaultMaxBodyBytes          = 64 << 10
	defaultSendQueue             = 256
	defaultPingInterval          = 20 * time.Second
	defaultWriteTimeout          = 10 * time.Second
	defaultSessionWorkers        = 4
	defaultDeliveredDelay        = 5 * time.Millisecond
	// ReplayWindow is how far a frame's timestamp may be from server time.
	ReplayWindow = 5 * time.Minute
)

// Config configures a Directory. Log and Registry are required; zero values
// of the rest mean the defaults.
type Config struct {
	// Log is the event log every step of every intent is recorded in.
	Log *tracing.Log
	// Registry resolves agents, API keys and policy.
	Registry *registry.Registry
	// Clock is the time source for timestamps, deadlines and the replay
	// window; default time.Now. Timers (result timeouts) run on real time.
	Clock func() time.Time
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics; nil means none.
	Registerer prometheus.Registerer

	// WSTimeout is the result timeout of intents sent over WebSocket (30 s).
	WSTimeout time.Duration
	// HTTPTimeout is the result timeout of POST /intents/send (60 s).
	HTTPTimeout time.Duration
	// DirectHTTPTimeout bounds one POST to a recipient's endpoint (30 s).
	DirectHTTPTimeout time.Duration
	// RelayTimeout (RELAY_TIMEOUT_MS) is the timeout recovery assumes for a
	// delivered intent whose events stored none (30 s).
	RelayTimeout time.Duration
	// RecoverySweepInterval (RELAY_RECOVERY_SWEEP_INTERVAL_MS) is how often
	// Start's sweep expires recovered delivered intents (5 s).
	RecoverySweepInterval time.Duration

	// AllowLegacyWSIdentity accepts WebSocket sessions without proof of
	// identity (reference 0.5.1 behaviour). Off by default.
	AllowLegacyWSIdentity bool
	// MaxFrameBytes bounds the delivered frame (JSON.stringify length), 4096.
	MaxFrameBytes int
	// MaxMessageBytes bounds one WebSocket message read (64 KiB; larger
	// ones close the session with 1009).
	MaxMessageBytes int
	// MaxBodyBytes bounds the POST /intents/send body (64 KiB).
	MaxBodyBytes int
	// SendQueue is the per-session send buffer in messages (256).
	SendQueue int
	// PingInterval is the WebSocket keepalive period (20 s).
	PingInterval time.Duration
	// WriteTimeout bounds one WebSocket write (10 s).
	WriteTimeout time.Duration
	// SessionWorkers is how many messages of one session are handled
	// concurrently (4). Handling an intent waits for a log commit; several
	// workers let one agent's intents share group commits.
	SessionWorkers int
	// DeliveredDelay is how long a written frame's delivered event may wait
	// to be recorded (5 ms): delivered events of many intents share one
	// append, and a result that comes within the delay is recorded with its
	// delivered in one append.
	DeliveredDelay time.Duration

	// HTTPClient supplies the transport (TLS settings) of direct-http
	// deliveries; default the standard transport with DirectHTTPTimeout.
	// The directory always adds its own dial and redirect rules to it
	// (outbound.go).
	HTTPClient *http.Client
	// AllowPrivateEndpoints lets direct-http deliveries dial loopback,
	// private, link-local and other non-public addresses (local
	// development). Off by default: such endpoints fail as not allowed.
	AllowPrivateEndpoints bool
	// OperatorAuth recognises operator requests; operators get the session
	// list in GET /stats. May be nil.
	OperatorAuth func(*http.Request) bool
	// Catalog, when set, restricts intents to the catalog's types and
	// checks their payloads (loadCatalog); nil accepts any intent type.
	Catalog *Catalog
	// AllowSender, when set, is asked once per intent whose sender has
	// been authenticated (not for intents a peer directory relays): false
	// refuses the intent with RATE_LIMITED, retryable after the duration.
	AllowSender func(beamID string) (bool, time.Duration)
	// Remote routes intents to agents of pinned peer directories (the
	// federation node, reached through a federation.Router the assembly
	// builds before the directory); nil without federation.
	Remote Remote
	// Cluster reaches the other nodes of this directory's cluster (the
	// cluster node, through a cluster.Router the assembly builds before the
	// directory); nil without cluster mode.
	Cluster NodeRouter
	// Owners hears what the owners of the nonces the directory does not
	// own (the message bus, the pipeline gateway) need of its sessions. They
	// deliver through the directory, so the assembly builds them after it
	// and has Owners reach them before anything is served. May be nil.
	Owners sessionOwner
	// parkLinger is how long an idle session's reader waits on its
	// goroutine for the next message before it parks (1 s); tests set it.
	parkLinger time.Duration
	// wrapConn, when set, wraps each hijacked WebSocket connection beneath
	// everything that writes to it; tests set it to see or break writes.
	wrapConn func(net.Conn) net.Conn

	// Attester signs frames their sender did not sign (API-key sessions,
	// bus sends, frames a peer vouches for) before they are delivered; nil
	// means a key that lives only as long as the process (tests).
	Attester *attest.Attester
}

// Directory is the relay. It is safe for concurrent use.
type Directory struct {
	cfg     Config
	log     *tracing.Log
	reg     *registry.Registry
	clock   func() time.Time
	lg      *slog.Logger
	m       *metrics
	client  *http.Client
	started time.Time

	mu        sync.Mutex
	claims    map[string]*inflight // nonce → what this process is doing with it
	sessions  map[string]*session  // beam ID → current session
	recovered map[string]time.Time // delivered intents resumed by Recover → deadline
	// busRecv holds the nonces the bus may keep in received, each with the
	// generation it was last noted at (busnonces.go).
	busRecv        map[string]uint64
	busRecvGen     uint64
	busRecvLimit   int
	busRecvPruning bool
	deliv          delivState // the delivered recorder (delivered.go)
	closed         bool
	attester       *attest.Attester

	connMu     sync.Mutex
	connNonces map[string]*replay.Set // beam ID → used ws.connect nonces
	connPruned time.Time              // last sweep of expired connect nonces

	keepalives *keepaliveWheel // pings every session once per PingInterval (keepalive.go)

	stop      chan struct{}
	sweeper   attempt.Loop // the recovery sweep, started by Start
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New returns a Directory. Call Recover before serving and Start after it.
func New(cfg Config) (*Directory, error) {
	if cfg.Log == nil {
		return nil, errors.New("directory: new: nil log")
	}
	if cfg.Registry == nil {
		return nil, errors.New("directory: new: nil registry")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.WSTimeout, defaultWSTimeout)
	def(&cfg.HTTPTimeout, defaultHTTPTimeout)
	def(&cfg.DirectHTTPTimeout, defaultDirectHTTPTimeout)
	def(&cfg.RelayTimeout, defaultRelayTimeout)
	def(&cfg.RecoverySweepInterval, defaultRecoverySweepInterval)
	def(&cfg.PingInterval, defaultPingInterval)
	def(&cfg.WriteTimeout, defaultWriteTimeout)
	def(&cfg.DeliveredDelay, defaultDeliveredDelay)
	def(&cfg.parkLinger, defaultParkLinger)
	defInt := func(d *int, v int) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt(&cfg.MaxFrameBytes, defaultMaxFrameBytes)
	defInt(&cfg.MaxMessageBytes, defaultMaxMessageBytes)
	defInt(&cfg.MaxBodyBytes, defaultMaxBodyBytes)
	defInt(&cfg.SendQueue, defaultSendQueue)
	defInt(&cfg.SessionWorkers, defaultSessionWorkers)
	client := endpointClient(cfg.HTTPClient, cfg.DirectHTTPTimeout, cfg.AllowPrivateEndpoints)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("directory: new: %w", err)
	}
	att := cfg.Attester
	if att == nil {
		if att, err = attest.Ephemeral("beam.directory"); err != nil {
			return nil, fmt.Errorf("directory: new: %w", err)
		}
	}
	d := &Directory{
		cfg:        cfg,
		log:        cfg.Log,
		reg:        cfg.Registry,
		clock:      cfg.Clock,
		lg:         cfg.Logger.With("component", "relay"),
		m:          m,
		client:     client,
		started:    cfg.Clock(),
		claims:     map[string]*inflight{},
		sessions:   map[string]*session{},
		recovered:  map[string]time.Time{},
		connNonces: map[string]*replay.Set{},
		attester:   att,
		stop:       make(chan struct{}),
		deliv:      delivState{kick: make(chan struct{}, 1)},
		keepalives: newKeepaliveWheel(cfg.PingInterval),
	}
	d.sweeper = attempt.Loop{Interval: d.cfg.RecoverySweepInterval, Logger: d.lg, Name: "recovery sweep",
		Tick: func(ctx context.Context) error {
			_, err := d.Sweep(ctx)
			return err
		}}
	d.wg.Add(1)
	go d.runKeepalives()
	return d, nil
}

// Routes registers POST /intents/send, the WebSocket endpoint (/ws and any
// path below it), GET /stats and GET /agents/stats on mux.
func (d *Directory) Routes(mux *http.ServeMux) {
	api := d.api()
	mux.HandleFunc("POST /intents/send", d.handleSend)
	mux.HandleFunc("GET /ws", d.handleWS)
	mux.HandleFunc("GET /ws/", d.handleWS)
	mux.HandleFunc("GET /stats", api.Handler(d.handleStats))
	mux.HandleFunc("GET /agents/stats", api.Handler(d.handleAgentStats))
	mux.HandleFunc("GET /intents/catalog", d.handleCatalog)
	mux.Handle("GET "+wire.AttestationKeysPath, d.attester)
}

// Start starts the recovery sweep, which fails recovered delivered intents
// whose deadline passed without a result. It stops with ctx or Close.
func (d *Directory) Start(ctx context.Context) {
	d.sweeper.Start(ctx)
}

// Close closes every session (1001 going away), stops the sweep and the
// result timers. In-flight intents stay as the log has them; the next
// start's Recover settles them. Close does not close the log or registry.
func (d *Directory) Close() error {
	d.closeOnce.Do(func() {
		close(d.stop)
		d.sweeper.Close()
		d.mu.Lock()
		d.closed = true
		sessions := make([]*session, 0, len(d.sessions))
		for _, s := range d.sessions {
			sessions = append(sessions, s)
		}
		// Senders still waiting for a result are told now (nothing is
		// recorded: the log keeps dispatched/delivered and the next start's
		// Recover settles them), so no request outlives the directory.
		var waiting []*inflight
		for _, inf := range d.claims {
			if inf.timer != nil {
				inf.timer.Stop()
			}
			if inf.waiting && !inf.finished {
				inf.waiting, inf.finished = false, true
				waiting = append(waiting, inf)
			}
		}
		d.mu.Unlock()
		for _, inf := range waiting {
			inf.done(nil, relayErr(CodeDeliveryFailed, inf.nonce, "directory is shutting down"))
		}
		for _, s := range sessions {
			s.closeWith(1001, "going away")
		}
		for _, s := range sessions {
			<-s.doneChan()
		}
		d.stopDelivered()
		d.wg.Wait()
	})
	return nil
}

// Online reports whether beamID has a WebSocket session on this directory.
func (d *Directory) Online(beamID string) bool {
	d.mu.Lock()
	_, ok := d.sessions[beamID]
	d.mu.Unlock()
	if r := d.nodeRouter(); !ok && r != nil {
		// In cluster mode, a session another node holds counts.
		_, ok = r.NodeFor(beamID)
	}
	return ok
}

// ConnectedAgents returns the number of attached sessions.
func (d *Directory) ConnectedAgents() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sessions)
}

type sessionInfo struct {
	BeamID      string `json:"beamId"`
	Auth        string `json:"auth"`
	ConnectedAt string `json:"connectedAt"`
	Queued      int    `json:"queued"`
}

// handleStats serves GET /stats.
func (d *Directory) handleStats(w http.ResponseWriter, r *http.Request) error {
	total, err := d.intentsProcessed(r.Context())
	if err != nil {
		d.lg.Warn("stats", "err", err)
		return httpjson.Internal("stats unavailable", err)
	}
	now := d.clock()
	body := map[string]any{
		"agents":           d.reg.Count(),
		"intentsProcessed": total,
		"connectedAgents":  d.ConnectedAgents(),
		"uptime":           int64(now.Sub(d.started) / time.Second),
		"version":          buildinfo.Version,
	}
	if d.cfg.OperatorAuth != nil && d.cfg.OperatorAuth(r) {
		d.mu.Lock()
		list := make([]sessionInfo, 0, len(d.sessions))
		for _, s := range d.sessions {
			list = append(list, sessionInfo{BeamID: s.beamID, Auth: s.auth, ConnectedAt: s.connectedAt.UTC().Format(time.RFC3339Nano), Queued: s.queued()})
		}
		d.mu.Unlock()
		sort.Slice(list, func(i, j int) bool { return list[i].BeamID < list[j].BeamID })
		body["sessions"] = list
	}
	httpjson.Write(w, http.StatusOK, body)
	return nil
}

// handleAgentStats serves GET /agents/stats.
func (d *Directory) handleAgentStats(w http.ResponseWriter, r *http.Request) error {
	total, verified := d.reg.Stats()
	processed, err := d.intentsProcessed(r.Context())
	if err != nil {
		d.lg.Warn("agent stats", "err", err)
		return httpjson.Internal("stats unavailable", err)
	}
	avg, err := d.log.AverageAckedLatency(r.Context())
	if err != nil {
		d.lg.Warn("agent stats", "err", err)
		return httpjson.Internal("stats unavailable", err)
	}
	httpjson.Write(w, http.StatusOK, map[string]any{
		"total_agents":         total,
		"verified_agents":      verified,
		"intents_processed":    processed,
		"avg_response_time_ms": int64(avg + 0.5),
	})
	return nil
}

// api is the adapter of the directory's routes: errors in the Beam shape,
// faults logged to the directory's logger.
func (d *Directory) api() httpjson.Adapter { return httpjson.Adapter{Log: d.lg} }

func (d *Directory) intentsProcessed(ctx context.Context) (int64, error) {
	counts, err := d.log.CountByState(ctx)
	if err != nil {
		return 0, fmt.Errorf("count intents: %w", err)
	}
	var n int64
	for _, c := range counts {
		n += c
	}
	return n, nil
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	httpjson.WriteRaw(w, status, "application/json", b)
}
