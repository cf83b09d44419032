package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/cmd/beam/internal/demo"
	"github.com/beamdir/beam/internal/gcpace"
)

// serveFlags are the flags of beam serve. The names of --data-dir and
// --listen (and their variables) are a stable interface.
type serveFlags struct {
	dataDir     string
	listen      string
	synchronous string
	logLevel    string
	logFormat   string
	drain       time.Duration

	secureCookies     bool
	demo              bool
	intentCatalog     string
	domain            string
	natsListen        string
	natsURL           string
	peers             stringList
	defaultPolicy     string
	legacyWSIdentity  bool
	insecureEndpoints bool
	privateEndpoints  bool
	openOrgs          bool
	wsTimeout         time.Duration
	httpTimeout       time.Duration
	relayTimeout      time.Duration
	sweepInterval     time.Duration

	busAPIKey          string
	busRetrySchedule   string
	busMaxAttempts     int
	busDeliveryTimeout time.Duration
	busTickInterval    time.Duration

	limits         limitFlags
	intentListen   string
	meshPolicies   string
	meshHopTimeout time.Duration
	pipelines      string
	cluster        clusterFlags
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dataDir, "data-dir", "./beam-data", "directory for the SQLite log, the operator token and the directory key")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:3100", "HTTP and WebSocket listen address (port 0 picks a free port)")
	fs.StringVar(&f.synchronous, "sqlite-synchronous", "FULL", "SQLite synchronous mode: FULL (every commit fsynced) or NORMAL")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&f.drain, "shutdown-timeout", 15*time.Second, "how long a graceful shutdown waits for in-flight requests")
	fs.StringVar(&f.domain, "domain", "", "the domain this directory serves: Beam IDs register only in it and the orgs beneath it (default beam.directory: personal IDs and every org); also its federation domain, e.g. acme.beam.directory")
	fs.StringVar(&f.natsListen, "nats-listen", "", "start the embedded NATS server for federation on HOST:PORT (federation is off without it or --nats-url)")
	fs.StringVar(&f.natsURL, "nats-url", "", "use an existing NATS deployment for federation instead of the embedded server")
	fs.Var(&f.peers, "peer", "pin a peer directory: DOMAIN=nats://HOST:PORT#PUBLICKEY as printed by 'beam peer show-self' (repeatable)")
	fs.StringVar(&f.intentCatalog, "intent-catalog", "", "JSON file of intent types with payload schemas; when set, other intent types are refused (default: any intent type is accepted)")
	fs.BoolVar(&f.demo, "demo", false, "also run a few built-in demo agents that exchange intents, so the dashboard has something to show")
	fs.BoolVar(&f.secureCookies, "secure-cookies", false, "mark dashboard session cookies Secure (when served over HTTPS)")
	fs.StringVar(&f.defaultPolicy, "default-policy", "same-org", "who may send to an agent that has no rule for the sender: same-org, allow or deny")
	fs.BoolVar(&f.legacyWSIdentity, "allow-legacy-ws-identity", false, "accept WebSocket sessions that prove no identity (beam-protocol-sdk 0.5.1); anyone can then receive any agent's intents")
	fs.BoolVar(&f.insecureEndpoints, "allow-insecure-endpoints", false, "let agents register http:// loopback endpoints for direct delivery (local development only)")
	fs.BoolVar(&f.privateEndpoints, "allow-private-endpoints", false, "let direct HTTP delivery reach loopback, private and link-local addresses (local development only; otherwise agents' endpoints must be public)")
	fs.BoolVar(&f.openOrgs, "open-orgs", false, "make every registrant of an org an approved member at once (a private directory whose registrants are all trusted); by default the org's first registrant or an operator approves members")
	fs.DurationVar(&f.wsTimeout, "ws-timeout", 30*time.Second, "result timeout of intents sent over WebSocket")
	fs.DurationVar(&f.httpTimeout, "http-timeout", 60*time.Second, "result timeout of POST /intents/send")
	fs.DurationVar(&f.relayTimeout, "relay-timeout", msEnv("RELAY_TIMEOUT_MS", 30*time.Second), "timeout assumed on restart for a delivered intent that stored none (also RELAY_TIMEOUT_MS, in ms)")
	fs.StringVar(&f.busAPIKey, "bus-api-key", "", "operator bus key: a trusted back-end presenting it (Authorization: Bearer) may send for local agents, poll, ack and requeue")
	fs.StringVar(&f.busRetrySchedule, "bus-retry-schedule", "30s,60s,120s,240s", "message bus delays after each failed attempt (the last repeats), ±15% jitter")
	fs.IntVar(&f.busMaxAttempts, "bus-max-attempts", 5, "message bus delivery attempts before a message is dead-lettered")
	fs.DurationVar(&f.busDeliveryTimeout, "bus-delivery-timeout", 30*time.Second, "how long a bus delivery waits for the recipient's result")
	fs.DurationVar(&f.busTickInterval, "bus-tick-interval", time.Second, "how often the bus retries due messages and expires poll leases")
	f.limits.register(fs)
	f.cluster.register(fs)
	fs.StringVar(&f.intentListen, "intent-listen", intentListenAuto, "listen address of the Intent Protocol v2.1 job bus (BUS_* variables configure it); "+intentListenAuto+": the --listen host, port + 100 (127.0.0.1:3200 for the default --listen, a free port for port 0); empty disables it")
	fs.StringVar(&f.meshPolicies, "mesh-policies", "", "JSON file of pipeline retry policies: {\"default\": {...}, \"actors\": {\"<beam id>\": {...}}}")
	fs.DurationVar(&f.meshHopTimeout, "mesh-hop-timeout", 30*time.Second, "how long one pipeline hop waits for its actor")
	fs.StringVar(&f.pipelines, "pipelines", os.Getenv("BEAM_PIPELINES"), "JSON file of declared pipelines, served as A2A agents and MCP tools: {\"pipelines\": [{\"name\", \"description\", \"inputSchema\", \"route\": [\"<beam id>\", ...]}]} (also BEAM_PIPELINES)")
	fs.DurationVar(&f.sweepInterval, "recovery-sweep-interval", msEnv("RELAY_RECOVERY_SWEEP_INTERVAL_MS", 5*time.Second), "how often intents recovered as delivered are checked for expiry (also RELAY_RECOVERY_SWEEP_INTERVAL_MS, in ms)")
}

// msEnv reads a duration in milliseconds from the environment variable name,
// the reference's convention, or returns def.
func msEnv(name string, def time.Duration) time.Duration {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || ms <= 0 {
		slog.Warn("ignoring invalid duration", "variable", name, "value", v)
		return def
	}
	return time.Duration(ms) * time.Millisecond
}

// config is the beam.Config the flags describe, with the settings beam
// serve takes from the environment (getenv): BEAM_ADMIN_TOKEN,
// BEAM_VIEWER_TOKEN and the job bus's BUS_* variables. It reads the files
// the flags name; logs go to stderr.
func (f *serveFlags) config(getenv func(string) string, stderr io.Writer) (beam.Config, error) {
	logger, err := newLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		return beam.Config{}, err
	}
	schedule, err := bus.ParseSchedule(f.busRetrySchedule)
	if err != nil {
		return beam.Config{}, err
	}
	catalog, err := readFlagFile("--intent-catalog", f.intentCatalog)
	if err != nil {
		return beam.Config{}, err
	}
	policies, err := readFlagFile("--mesh-policies", f.meshPolicies)
	if err != nil {
		return beam.Config{}, err
	}
	pipelines, err := readFlagFile("--pipelines", f.pipelines)
	if err != nil {
		return beam.Config{}, err
	}
	var jobBus beam.JobBus
	if f.intentListen != "" {
		if jobBus.Settings, err = jobs.ConfigFromEnv(getenv); err != nil {
			return beam.Config{}, err
		}
		jobBus.Enabled = true
	}
	cluster, err := f.cluster.config()
	if err != nil {
		return beam.Config{}, err
	}
	lim := f.limits.config()
	return beam.Config{
		DataDir:                f.dataDir,
		Synchronous:            f.synchronous,
		AdminToken:             getenv("BEAM_ADMIN_TOKEN"),
		ViewerToken:            getenv("BEAM_VIEWER_TOKEN"),
		SecureCookies:          f.secureCookies,
		DefaultPolicy:          f.defaultPolicy,
		AllowLegacyWSIdentity:  f.legacyWSIdentity,
		AllowInsecureEndpoints: f.insecureEndpoints,
		AllowPrivateEndpoints:  f.privateEndpoints,
		OpenOrgs:               f.openOrgs,
		Domain:                 f.domain,
		IntentCatalog:          catalog,
		Federation:             beam.Federation{NATSListen: f.natsListen, NATSURL: f.natsURL, Peers: f.peers},
		Cluster:                cluster,
		Bus: beam.Bus{APIKey: f.busAPIKey, RetrySchedule: schedule, MaxAttempts: f.busMaxAttempts,
			DeliveryTimeout: f.busDeliveryTimeout, TickInterval: f.busTickInterval},
		JobBus:    jobBus,
		Pipelines: beam.Pipelines{Declared: pipelines, Policies: policies, HopTimeout: f.meshHopTimeout},
		Timeouts: beam.Timeouts{WebSocket: f.wsTimeout, HTTP: f.httpTimeout, Relay: f.relayTimeout,
			RecoverySweep: f.sweepInterval},
		Limits: &lim,
		Logger: logger,
	}, nil
}

// readFlagFile reads the file the flag names; an empty path is no file.
func readFlagFile(flagName, path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	return b, nil
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam serve", "beam serve [flags]", stderr,
		"Runs a Beam directory: agents, intents, the message bus and the dashboard on one port,",
		"with every step of every intent recorded in an append-only log in --data-dir.")
	var f serveFlags
	f.register(fs.FlagSet)
	if err := fs.parseNoArgs(args); err != nil {
		return err
	}
	cfg, err := f.config(os.Getenv, stderr)
	if err != nil {
		return err
	}
	if f.intentListen, err = intentListenAddr(f.listen, f.intentListen); err != nil {
		return err
	}
	for {
		err := serve(ctx, &f, cfg, stdout, stderr)
		if !errors.Is(err, beam.ErrLogTakenOver) || ctx.Err() != nil {
			return err
		}
		if err := restartTakenOver(f.dataDir, cfg.Logger, err); err != nil {
			return err
		}
	}
}

// serve runs one directory on cfg until ctx ends or it stops.
func serve(ctx context.Context, f *serveFlags, cfg beam.Config, stdout, stderr io.Writer) error {
	logger := cfg.Logger
	srv, err := beam.New(ctx, cfg)
	if err != nil {
		return err
	}
	// A start that fails before it serves removes the secrets it generated
	// (Abandon): they were never printed, and the next start prints new ones.
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		_ = srv.Abandon(context.Background())
		return fmt.Errorf("listen: %w (is another beam serve running there? --listen sets the address)", err)
	}
	var iln net.Listener
	if f.intentListen != "" {
		if iln, err = net.Listen("tcp", f.intentListen); err != nil {
			_ = ln.Close()
			_ = srv.Abandon(context.Background())
			return fmt.Errorf("intent listen: %w (--intent-listen sets the address; empty turns the job bus off)", err)
		}
		secret, generated := srv.JobBusSecret()
		fmt.Fprintln(stdout, secretLine("intent bus BUS_SECRET", filepath.Join(f.dataDir, "intent.secret"), "BUS_SECRET",
			"; job bus clients send it as X-API-KEY", secret, generated))
		fmt.Fprintf(stdout, "intent bus serving on http://%s\n", iln.Addr())
	}
	tokenPath := filepath.Join(f.dataDir, "admin.token")
	tokenHint := operatorTokenLine(srv, tokenPath)
	fmt.Fprintln(stdout, tokenHint)
	viewer, generated := srv.ViewerToken()
	fmt.Fprintln(stdout, secretLine("read-only viewer token", filepath.Join(f.dataDir, "viewer.token"), "BEAM_VIEWER_TOKEN",
		"; it signs in to the dashboard to read", viewer, generated))
	if line := srv.PeerLine(); line != "" {
		fmt.Fprintf(stdout, "federation: %s\n", line)
	}
	fmt.Fprintf(stdout, "dashboard: http://%s/dashboard/ (API index: http://%s/)\n", ln.Addr(), ln.Addr())
	fmt.Fprintf(stdout, "beam serving on http://%s\n", ln.Addr())
	logger.Info("beam serving", "addr", ln.Addr().String(), "dataDir", f.dataDir)

	paceCtx, stopPacing := context.WithCancel(ctx)
	defer stopPacing()
	go gcpace.Run(paceCtx, logger)

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if iln != nil {
		go func() {
			if err := srv.ServeJobBus(iln); err != nil {
				errc <- err
			}
		}()
	}
	if f.demo {
		demoCtx, stopDemo := context.WithCancel(ctx)
		defer stopDemo()
		dcfg := demo.Config{
			DirectoryURL: "http://" + ln.Addr().String(),
			StateDir:     filepath.Join(f.dataDir, "demo"),
			Logger:       logger,
		}
		if iln != nil {
			dcfg.JobBusURL = "http://" + iln.Addr().String()
			dcfg.JobBusKey, _ = srv.JobBusSecret()
		}
		go func() {
			err := demo.Run(demoCtx, dcfg)
			if err != nil {
				logger.Error("demo agents stopped", "err", err)
			}
		}()
		fmt.Fprintf(stdout, "demo agents running; open http://%s/dashboard/ and sign in with the operator token, %s\n", ln.Addr(), tokenSource(tokenPath))
	}
	select {
	case err := <-errc:
		_ = srv.Shutdown(context.Background())
		return err
	case <-srv.TakenOver():
		sctx, cancel := context.WithTimeout(context.Background(), f.drain)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return beam.ErrLogTakenOver
	case <-ctx.Done():
	}
	logger.Info("shutting down: draining requests and the log writer")
	sctx, cancel := context.WithTimeout(context.Background(), f.drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	<-errc
	logger.Info("stopped")
	return nil
}

// operatorTokenLine is the startup line about the operator token: the token
// itself when this start generated it, otherwise where it is.
func operatorTokenLine(srv *beam.Server, path string) string {
	tok, generated := srv.AdminToken()
	return secretLine("operator token", path, "BEAM_ADMIN_TOKEN", "; operator commands read it with --data-dir", tok, generated)
}

// secretLine is the startup line about a secret of the data directory
// (what, stored in path unless the variable env sets it): the secret
// itself when this start generated it, otherwise where it comes from, so
// that every start says where each secret is.
func secretLine(what, path, env, hint, secret string, generated bool) string {
	switch {
	case generated:
		return fmt.Sprintf("%s (stored in %s, shown once): %s", what, path, secret)
	case os.Getenv(env) != "":
		return what + ": from " + env
	}
	return fmt.Sprintf("%s: in %s (cat it%s)", what, path, hint)
}

// tokenSource says where the operator token of this start comes from.
func tokenSource(path string) string {
	if os.Getenv("BEAM_ADMIN_TOKEN") != "" {
		return "from BEAM_ADMIN_TOKEN"
	}
	return "in " + path + " (cat it; operator commands read it with --data-dir)"
}
