package beam

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/bus/a2a"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/attest"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/internal/buildinfo"
	"github.com/beamdir/beam/internal/dirlock"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/limits"
	"github.com/beamdir/beam/tracing"
	"github.com/beamdir/beam/web"
)

// Server is a directory built by New. It answers HTTP once Serve is called.
type Server struct {
	cfg      Config // defaults filled in; Limits is the one in force
	parsed   parsed // what cfg's text fields hold
	log      *tracing.Log
	agents   *registry.Registry
	dir      *directory.Directory
	bus      *bus.Bus
	mesh     *mesh.Engine
	a2a      *a2a.Server // A2A server (agentprotocols.go)
	fed      *federation.Node
	cluster  *cluster.Node
	repl     *logReplicator // cluster mode: ships the log through cluster
	shipped  *shippedLog    // cluster mode: the log as the cluster sees it
	registry *prometheus.Registry
	mux      *http.ServeMux
	started  time.Time
	logger   *slog.Logger

	adminToken       string
	adminTokenIsNew  bool
	viewerToken      string
	viewerTokenIsNew bool
	httpSrv          *http.Server
	rl               *rateLimits
	lock             *dirlock.Lock
	intent           *intentBus
	dash             *web.Dashboard
	shutdownOnce     sync.Once
	shutdownErr      error
}

// New opens (or creates) the directory in cfg.DataDir: it opens the event
// log, runs startup recovery and, with federation configured, joins its
// peers. It does not listen; call Serve (and ServeJobBus).
func New(ctx context.Context, cfg Config) (*Server, error) {
	p, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	lim := cfg.limits()
	cfg.Limits = &lim
	if cfg.DataDir == "" {
		cfg.DataDir = "./beam-data"
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The data-directory lock comes before anything else in it is opened:
	// a second process must not run recovery on a live log.
	lock, err := dirlock.Acquire(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := restrictSecretFiles(cfg.DataDir); err != nil {
		_ = lock.Release()
		return nil, err
	}
	s := &Server{
		lock:     lock,
		rl:       newRateLimits(lim, cfg.Clock),
		cfg:      cfg,
		parsed:   p,
		registry: prometheus.NewRegistry(),
		mux:      http.NewServeMux(),
		started:  cfg.Clock(),
		logger:   cfg.Logger,
	}
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	ok := false
	defer func() {
		if !ok {
			s.removeGenerated()
			_ = lock.Release()
		}
	}()
	token, isNew, err := loadToken(cfg.DataDir, "admin.token", "bop_", cfg.AdminToken)
	if err != nil {
		return nil, err
	}
	s.adminToken, s.adminTokenIsNew = token, isNew
	token, isNew, err = loadToken(cfg.DataDir, "viewer.token", "bvw_", cfg.ViewerToken)
	if err != nil {
		return nil, err
	}
	s.viewerToken, s.viewerTokenIsNew = token, isNew

	tcfg := tracing.Config{
		Path:        filepath.Join(cfg.DataDir, "beam.db"),
		Synchronous: cfg.Synchronous,
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  s.registry,
	}
	if cfg.Cluster.Enabled {
		// Nothing is acknowledged before it is in the cluster's log stream.
		s.repl, s.shipped = &logReplicator{}, newShippedLog(s)
		tcfg.Replicator = s.repl
	}
	lg, err := tracing.Open(ctx, tcfg)
	if err != nil {
		return nil, fmt.Errorf("open event log: %w", err)
	}
	s.log = lg

	if err := s.openDirectory(ctx); err != nil {
		_ = lg.Close()
		return nil, err
	}

	s.httpSrv = &http.Server{
		Handler:           s.limit(s.clusterHandler(s.mux)),
		ReadHeaderTimeout: cmp.Or(cfg.Limits.ReadHeaderTimeout, defaultReadHeaderTimeout),
		WriteTimeout:      s.writeTimeout(),
		IdleTimeout:       cfg.Limits.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /openapi.json", handleOpenAPI)
	s.mountPprof()
	// Metrics name peers, outbox states and error codes: operators only.
	s.mux.Handle("GET /metrics", s.operatorOnly(promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}).ServeHTTP))
	if err := s.openIntentBus(ctx); err != nil {
		_ = s.Abandon(ctx)
		return nil, err
	}
	if s.shipped != nil {
		close(s.shipped.ready) // takeovers may hand work to every subsystem now
	}
	ok = true
	return s, nil
}

// Abandon shuts down a directory that never served, as Shutdown does, and
// first removes the operator token, viewer token and job bus secret files
// this start generated: nobody has seen them, and the next start generates
// (and can show) new ones.
func (s *Server) Abandon(ctx context.Context) error {
	s.removeGenerated()
	return s.Shutdown(ctx)
}

// removeGenerated removes the secret files this start generated. The data
// directory lock is still held.
func (s *Server) removeGenerated() {
	for name, generated := range map[string]bool{
		"admin.token":   s.adminTokenIsNew,
		"viewer.token":  s.viewerTokenIsNew,
		"intent.secret": s.intent != nil && s.intent.secretIsNew,
	} {
		if generated {
			if err := os.Remove(filepath.Join(s.cfg.DataDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.logger.Warn("remove a secret of a failed start", "file", name, "err", err)
			}
		}
	}
}

// Log is the directory's event log, for programs and tests that read its
// traces.
func (s *Server) Log() *tracing.Log { return s.log }

// Handler is the directory's HTTP handler, for programs that serve it
// behind their own http.Server or mux.
func (s *Server) Handler() http.Handler { return s.mux }

// AdminToken returns the operator token, and whether this start generated
// it (so a program can show it once).
func (s *Server) AdminToken() (token string, generated bool) {
	return s.adminToken, s.adminTokenIsNew
}

// ViewerToken returns the read-only dashboard token and whether it was
// generated by this start.
func (s *Server) ViewerToken() (token string, generated bool) {
	return s.viewerToken, s.viewerTokenIsNew
}

// IsOperator reports whether r carries the operator token, as
// "Authorization: Bearer <token>" or "X-Admin-Token: <token>".
func (s *Server) IsOperator(r *http.Request) bool {
	got := strings.TrimSpace(r.Header.Get("X-Admin-Token"))
	if got == "" {
		got, _ = httpjson.Bearer(r)
	}
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.adminToken)) == 1
}

// Serve answers HTTP and WebSocket requests on ln until Shutdown; it
// returns nil after a graceful shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if s.cluster != nil {
		s.cluster.SetURL("http://" + ln.Addr().String())
	}
	if s.cfg.Limits.MaxConns > 0 || s.cfg.Limits.MaxConnsPerAddr > 0 {
		ln = limits.NewListener(ln, s.cfg.Limits.MaxConns, s.cfg.Limits.MaxConnsPerAddr)
	}
	err := s.httpSrv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting requests, waits for those in flight (bounded by
// ctx), commits everything accepted and closes the data directory.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		var errs []error
		if err := s.httpSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
		}
		if err := s.closeIntentBus(ctx); err != nil {
			errs = append(errs, err)
		}
		if s.cluster != nil {
			_ = s.cluster.Close()
		}
		if s.fed != nil {
			if err := s.fed.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close federation: %w", err))
			}
		}
		if s.a2a != nil {
			s.a2a.Close() // its push notification followers
		}
		if s.mesh != nil {
			_ = s.mesh.Close()
		}
		if err := s.bus.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close bus: %w", err))
		}
		if err := s.dir.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close directory: %w", err))
		}
		if err := s.agents.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("close registry: %w", err))
		}
		if err := s.log.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close log: %w", err))
		}
		if err := s.lock.Release(); err != nil {
			errs = append(errs, fmt.Errorf("release data-directory lock: %w", err))
		}
		s.shutdownErr = errors.Join(errs...)
	})
	return s.shutdownErr
}

type healthDB struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

type healthResponse struct {
	Status          string   `json:"status"`
	Protocol        string   `json:"protocol"`
	Version         string   `json:"version"`
	GitSha          string   `json:"gitSha,omitempty"`
	UptimeSeconds   int64    `json:"uptimeSeconds"`
	ConnectedAgents int      `json:"connectedAgents"`
	Timestamp       string   `json:"timestamp"`
	DB              healthDB `json:"db"`
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	now := s.cfg.Clock()
	resp := healthResponse{
		Status:          "ok",
		Protocol:        "beam/1",
		Version:         buildinfo.Version,
		GitSha:          buildinfo.Revision(),
		UptimeSeconds:   int64(now.Sub(s.started) / time.Second),
		ConnectedAgents: s.dir.ConnectedAgents(),
		Timestamp:       now.UTC().Format(time.RFC3339Nano),
		DB:              healthDB{Status: "ok"},
	}
	status := http.StatusOK
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.log.Ping(ctx); err != nil {
		resp.Status = "degraded"
		resp.DB = healthDB{Status: "error", Error: err.Error()}
		status = http.StatusServiceUnavailable
	}
	httpjson.Write(w, status, resp)
}

// loadToken returns the configured token, or the one stored in the data
// directory under name, generating and storing a new one (with prefix) on
// first start.
func loadToken(dataDir, name, prefix, configured string) (string, bool, error) {
	if configured != "" {
		return configured, false, nil
	}
	path := filepath.Join(dataDir, name)
	b, err := os.ReadFile(path)
	if err == nil {
		tok := strings.TrimSpace(string(b))
		if tok != "" {
			return tok, false, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("read %s: %w", name, err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", false, fmt.Errorf("generate %s: %w", name, err)
	}
	tok := prefix + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("store %s: %w", name, err)
	}
	return tok, true, nil
}

// openDirectory opens the agent registry and the relay, runs startup
// recovery (before anything is served) and starts the recovery sweep.
func (s *Server) openDirectory(ctx context.Context) (err error) {
	policy := registry.Policy(s.cfg.DefaultPolicy)
	if policy == "" {
		policy = registry.PolicySameOrg
	}
	switch policy {
	case registry.PolicySameOrg, registry.PolicyAllow, registry.PolicyDeny:
	default:
		return fmt.Errorf("default policy %q: want same-org, allow or deny", s.cfg.DefaultPolicy)
	}
	// Everything opened so far is closed again, in reverse, if a later part
	// fails to start.
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()

	// The registry, the directory and the bus reach the federation node,
	// built after them, through one router (cluster mode runs federation
	// too); the directory reaches the cluster node through another.
	var peers *federation.Router
	var regPeers registry.Peers
	var dirRemote directory.Remote
	var busRemote bus.Remote
	if s.cfg.Federation.NATSListen != "" || s.cfg.Federation.NATSURL != "" || s.cfg.Cluster.Enabled {
		peers = &federation.Router{}
		regPeers, dirRemote, busRemote = peers, peers, peers
	}
	// The registry and the directory reach the cluster node through
	// another.
	var nodes *cluster.Router
	var regCluster registry.Replicator
	var dirCluster directory.NodeRouter
	if s.cfg.Cluster.Enabled {
		nodes = &cluster.Router{Clock: s.cfg.Clock}
		regCluster, dirCluster = nodes, nodes
	}
	agents, err := registry.Open(ctx, s.log, registry.Config{
		Peers:         regPeers,
		Replicator:    regCluster,
		DefaultPolicy: policy,
		OperatorAuth: func(r *http.Request) (string, bool) {
			if s.IsOperator(r) {
				return "admin", true
			}
			return "", false
		},
		Clock:                  s.cfg.Clock,
		Logger:                 s.logger,
		AllowInsecureEndpoints: s.cfg.AllowInsecureEndpoints,
		Domain:                 s.cfg.Domain,
		OpenOrgs:               s.cfg.OpenOrgs,
	})
	if err != nil {
		return fmt.Errorf("open registry: %w", err)
	}
	closers = append(closers, func() { _ = agents.Close(context.WithoutCancel(ctx)) })
	attestedBy := s.cfg.Domain
	if attestedBy == "" {
		attestedBy = "beam.directory"
	}
	attester, err := attest.LoadOrCreate(s.cfg.DataDir, attestedBy)
	if err != nil {
		return err
	}
	owners := &nonceOwners{}
	dir, err := directory.New(directory.Config{
		Owners:                owners,
		Remote:                dirRemote,
		Cluster:               dirCluster,
		Attester:              attester,
		Log:                   s.log,
		Registry:              agents,
		Clock:                 s.cfg.Clock,
		Logger:                s.logger,
		Registerer:            s.registry,
		WSTimeout:             s.cfg.Timeouts.WebSocket,
		HTTPTimeout:           s.cfg.Timeouts.HTTP,
		RelayTimeout:          s.cfg.Timeouts.Relay,
		RecoverySweepInterval: s.cfg.Timeouts.RecoverySweep,
		AllowLegacyWSIdentity: s.cfg.AllowLegacyWSIdentity,
		AllowPrivateEndpoints: s.cfg.AllowPrivateEndpoints,
		Catalog:               s.parsed.catalog,
		OperatorAuth:          s.IsOperator,
		AllowSender:           s.rl.intents.Allow,
	})
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	closers = append(closers, func() { _ = dir.Close() })
	if _, err := dir.Recover(ctx); err != nil {
		return fmt.Errorf("startup recovery: %w", err)
	}
	b, err := bus.New(bus.Config{
		Log: s.log, Directory: dir, Registry: agents, Clock: s.cfg.Clock, Logger: s.logger,
		Registerer: s.registry, BusAPIKey: s.cfg.Bus.APIKey, OperatorAuth: s.IsOperator,
		Schedule: s.cfg.Bus.RetrySchedule, MaxAttempts: s.cfg.Bus.MaxAttempts,
		DeliveryTimeout: s.cfg.Bus.DeliveryTimeout, TickInterval: s.cfg.Bus.TickInterval,
		AllowSender: s.rl.busSends.Allow, Remote: busRemote,
	})
	if err != nil {
		return fmt.Errorf("open message bus: %w", err)
	}
	closers = append(closers, func() { _ = b.Close() })
	owners.bus = b
	if _, err := b.Recover(ctx); err != nil {
		return fmt.Errorf("message bus recovery: %w", err)
	}

	pipes, err := mesh.New(mesh.Config{
		Log: s.log, Directory: dir, Registry: agents, Clock: s.cfg.Clock, Logger: s.logger, Registerer: s.registry,
		OperatorAuth: s.IsOperator, Policies: s.parsed.meshPolicies, Default: s.parsed.meshDefault,
		HopTimeout:  s.cfg.Pipelines.HopTimeout,
		AllowCreate: s.rl.meshCreates.Allow, MaxOpenPerCreator: s.cfg.Limits.MeshOpenPerCreator,
	})
	if err != nil {
		return fmt.Errorf("open pipelines: %w", err)
	}
	closers = append(closers, func() { _ = pipes.Close() })
	owners.mesh = pipes
	if _, err := pipes.Recover(ctx); err != nil {
		return fmt.Errorf("pipeline recovery: %w", err)
	}

	var fedStatus func(context.Context) (any, error)
	if err := s.openCluster(agents, dir, nodes); err != nil {
		return err
	}
	if s.cfg.Federation.NATSListen != "" || s.cfg.Federation.NATSURL != "" {
		node, err := s.openFederation(ctx, agents, dir, peers, b.RemoteOutcome)
		if err != nil {
			return err
		}
		closers = append(closers, func() { _ = node.Close() })
		s.fed = node
		fedStatus = node.Status
	}
	if err := s.startCluster(ctx); err != nil {
		return err
	}
	if s.cluster != nil {
		closers = append(closers, func() { _ = s.cluster.Close() })
	}

	dash, err := web.New(web.Config{
		Log: s.log, Registry: agents, Directory: dir, Requeue: b.Requeue, Federation: fedStatus,
		Cluster: s.clusterStatus(),
		MeshRequeue: func(ctx context.Context, id string) (string, error) {
			row, err := pipes.Requeue(ctx, id)
			return row.ID, err
		},
		AdminToken: s.adminToken, ViewerToken: s.viewerToken,
		Clock: s.cfg.Clock, Logger: s.logger, SecureCookies: s.cfg.SecureCookies,
	})
	if err != nil {
		return fmt.Errorf("open dashboard: %w", err)
	}

	dir.Start(context.WithoutCancel(ctx))
	b.Start(context.WithoutCancel(ctx))
	agents.Routes(s.mux)
	dir.Routes(s.mux)
	b.Routes(s.mux)
	pipes.Start(context.WithoutCancel(ctx))
	pipes.Routes(s.mux)
	if err := s.mountAgentProtocols(pipes, agents, b); err != nil {
		return err
	}
	if s.fed != nil {
		s.fed.Routes(s.mux)
	}
	dash.Routes(s.mux)
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if web.WantsHTML(r) {
			http.Redirect(w, r, "/dashboard/", http.StatusFound)
			return
		}
		// Non-HTML clients get an index of where to go next.
		httpjson.Write(w, http.StatusOK, map[string]any{
			"name":     "beam",
			"protocol": "beam/1",
			"links": map[string]string{
				"health":    "/health",
				"dashboard": "/dashboard/",
				"agents":    "/agents/search",
				"send":      "/intents/send",
				"bus":       "/v1/beam/send",
				"docs":      "https://github.com/beamdir/beam#readme",
			},
		})
	})
	s.agents, s.dir, s.bus, s.dash, s.mesh = agents, dir, b, dash, pipes
	return nil
}

// openFederation loads (or creates) the directory key and starts the
// federation node: the embedded NATS server or a client of NATSURL, the
// pinned peers and the outbox relay.
func (s *Server) openFederation(ctx context.Context, agents *registry.Registry, dir *directory.Directory,
	router *federation.Router, busOutcome func(nonce string)) (*federation.Node, error) {
	if s.cfg.Domain == "" {
		return nil, errors.New("federation needs --domain")
	}
	key, _, err := federation.LoadOrCreateKey(s.cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("directory key: %w", err)
	}
	node, err := federation.New(ctx, federation.Config{
		Domain: s.cfg.Domain, Key: key, Log: s.log, Directory: dir, Registry: agents, Router: router, BusOutcome: busOutcome,
		NATSListen: s.cfg.Federation.NATSListen, NATSURL: s.cfg.Federation.NATSURL, Peers: s.parsed.peers,
		Clock: s.cfg.Clock, Logger: s.logger, Registerer: s.registry, OperatorAuth: s.IsOperator,
		ServerOptions: s.natsServerOptions(), QueueGroup: s.federationQueue(), BeforeSubscribe: s.clusterIdentity(ctx),
	})
	if err != nil {
		return nil, fmt.Errorf("open federation: %w", err)
	}
	if err := node.Start(ctx); err != nil {
		_ = node.Close()
		return nil, fmt.Errorf("start federation: %w", err)
	}
	s.logger.Info("federation", "self", node.Self().Line(), "peers", len(node.Peers()))
	return node, nil
}

// Federation is the federation node, or nil when federation is off, for
// programs and tests that pin peers while the directory runs.
func (s *Server) Federation() *federation.Node { return s.fed }

// operatorOnly answers 401 to a request without the operator token.
func (s *Server) operatorOnly(h http.HandlerFunc) http.HandlerFunc {
	return httpjson.Adapter{Log: s.logger}.Handler(func(w http.ResponseWriter, r *http.Request) error {
		if !s.IsOperator(r) {
			return httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "operator token required")
		}
		h(w, r)
		return nil
	})
}

// mountPprof serves the Go profiles under /debug/pprof/ to operators only.
func (s *Server) mountPprof() {
	guard := s.operatorOnly
	s.mux.HandleFunc("GET /debug/pprof/", guard(pprof.Index))
	s.mux.HandleFunc("GET /debug/pprof/cmdline", guard(pprof.Cmdline))
	s.mux.HandleFunc("GET /debug/pprof/profile", guard(pprof.Profile))
	s.mux.HandleFunc("GET /debug/pprof/symbol", guard(pprof.Symbol))
	s.mux.HandleFunc("GET /debug/pprof/trace", guard(pprof.Trace))
}
