package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/beamdir/beam/cmd/beam/internal/bench"
)

// benchFlags are the flags of beam bench. --url, --mode, --count,
// --concurrency and --json are a stable interface.
type benchFlags struct {
	url         string
	mode        string
	count       int
	concurrency int
	json        bool

	rate             float64
	duration         time.Duration
	warmup           int
	senders          int
	recipients       int
	idleAgents       int
	idleSettle       time.Duration
	registerParallel int
	payloadBytes     int
	timeout          time.Duration
	serverPID        int
	operatorToken    string

	synchronous string
	dataDir     string
	serverLog   bool
	logLevel    string

	restartEvents int
	inFlightEvery int

	peerURL       string
	domain        string
	peerDomain    string
	peerServerPID int
	hops          int
	clusterNodes  int
	compareSingle bool

	chaos         bool
	chaosDuration time.Duration
	chaosKills    int
	chaosSeed     uint64
	chaosRate     float64
	chaosWorkers  int
	chaosSettle   time.Duration
	chaosMix      bool
	chaosRole     string
	chaosDelete   bool
	chaosRestart  bool
	chaosDelay    time.Duration

	cpuProfile string

	// a2aPipelines is the --pipelines file of the directory a --mode a2a
	// run starts (not a flag).
	a2aPipelines []byte
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", "", "base URL of a running directory; empty starts a beam serve process on a temporary data directory")
	fs.StringVar(&f.mode, "mode", "ws", "how intents are sent: ws, http, bus, federation, mesh (pipeline envelopes) or a2a (A2A messages to a declared pipeline); jobs runs Intent Protocol publishers and workers")
	fs.IntVar(&f.hops, "hops", 3, "--mode mesh and a2a: actors in each envelope's route")
	fs.IntVar(&f.clusterNodes, "cluster-nodes", 0, "without --url, --mode ws, http, bus, mesh or jobs: start `N` beam serve --cluster nodes of one domain and spread the load over them (ws, http: agents round-robin; bus, mesh: senders on the first node, recipients on the others; jobs: publishes through the first node, claims through the others); server figures summed over the nodes, and per node. With --chaos: the cluster chaos run")
	fs.BoolVar(&f.compareSingle, "compare-single", true, "with --cluster-nodes: first run the same load on one beam serve on this machine, and report both and the cluster's figures relative to it")
	fs.IntVar(&f.count, "count", 10000, "intents of a burn-down run")
	fs.IntVar(&f.concurrency, "concurrency", 64, "intents in flight at most")
	fs.BoolVar(&f.json, "json", false, "print one JSON object instead of the table")
	fs.Float64Var(&f.rate, "rate", 0, "steady-rate run: intents per second for --duration (0: burn-down of --count)")
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "length of a steady-rate run")
	fs.IntVar(&f.warmup, "warmup", 200, "intents sent before the measurement, not counted")
	fs.IntVar(&f.senders, "senders", 0, "sending agents (default min(concurrency, 8))")
	fs.IntVar(&f.recipients, "recipients", 0, "answering agents (default min(concurrency, 8))")
	fs.IntVar(&f.idleAgents, "idle-agents", 0, "agents to register and keep connected but idle; the server's RSS is reported once they are connected")
	fs.DurationVar(&f.idleSettle, "idle-settle", 30*time.Second, "with --idle-agents: how long the agents stay idle before the server's RSS is read again, once the garbage of the connects is collected and returned (0: no second reading)")
	fs.IntVar(&f.registerParallel, "register-parallel", 16, "registrations in flight at most")
	fs.IntVar(&f.payloadBytes, "payload-bytes", 64, "filler bytes in each intent's payload")
	fs.DurationVar(&f.timeout, "timeout", 35*time.Second, "how long one intent may take")
	fs.IntVar(&f.serverPID, "server-pid", 0, "with --url: process id of the server on this machine, read for CPU and RSS")
	fs.StringVar(&f.operatorToken, "admin-token", "", "with --url: the server's operator token, to break its memory per idle agent down from its /metrics")
	fs.StringVar(&f.synchronous, "sqlite-synchronous", "FULL", "without --url: SQLite synchronous mode of the started server")
	fs.StringVar(&f.dataDir, "data-dir", "", "without --url: data directory of the started server (default a temporary one, removed afterwards)")
	fs.BoolVar(&f.serverLog, "server-log", false, "without --url: copy the started server's log to stderr")
	fs.StringVar(&f.logLevel, "log-level", "warn", "progress log level on stderr: debug, info, warn, error")
	fs.IntVar(&f.restartEvents, "restart-events", 0, "instead of a load run: seed a log with this many events and time two starts of beam serve on it")
	fs.IntVar(&f.inFlightEvery, "restart-in-flight-every", 1000, "with --restart-events: leave every n-th seeded intent in flight (0: none)")
	fs.StringVar(&f.peerURL, "peer-url", "", "--mode federation with --url: base URL of the second directory, federated with --url's (recipients connect there)")
	fs.StringVar(&f.domain, "domain", "alpha.beam.directory", "--mode federation: federation domain of the senders' directory")
	fs.StringVar(&f.peerDomain, "peer-domain", "beta.beam.directory", "--mode federation: federation domain of the recipients' directory")
	fs.IntVar(&f.peerServerPID, "peer-server-pid", 0, "with --peer-url: process id of the second directory, read for CPU and RSS")
	fs.BoolVar(&f.chaos, "chaos", false, "instead of a load run: a mixed durable load while the beam serve process is SIGKILLed and restarted, then check the log's invariants (exit status 1 on a violation)")
	fs.DurationVar(&f.chaosDuration, "chaos-duration", 5*time.Minute, "with --chaos: length of the load")
	fs.IntVar(&f.chaosKills, "chaos-kills", 3, "with --chaos: how many times the server is SIGKILLed")
	fs.Uint64Var(&f.chaosSeed, "chaos-seed", 0, "with --chaos: seed of the kill schedule and the load (0: random, printed)")
	fs.BoolVar(&f.chaosMix, "chaos-mix", true, "with --chaos: mix synchronous intents, Intent Protocol jobs (published, claimed, fulfilled or failed) and pipeline envelopes into the durable bus sends, and check none acknowledged is lost, no job is fulfilled twice and every envelope finishes once; false: bus sends only")
	fs.Float64Var(&f.chaosRate, "chaos-rate", 200, "with --chaos: operations (durable sends, and with --chaos-mix intents, job publishes, envelopes) per second at most")
	fs.IntVar(&f.chaosWorkers, "chaos-workers", 16, "with --chaos: sends in flight at most")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the load generator (this process, not the server) during the run to this file")
	fs.StringVar(&f.chaosRole, "chaos-kill-role", bench.RoleAll, fmt.Sprintf("with --chaos --cluster-nodes 3: the node killed: %s (accepts the sends, creates and publishes), %s (the recipients, actors and workers are connected to it), %s (the job bus's home) or %s (one run per role, in sequence)",
		bench.RoleOwner, bench.RoleHolder, bench.RoleHome, bench.RoleAll))
	fs.BoolVar(&f.chaosDelete, "chaos-delete-data", false, "with --chaos --cluster-nodes 3: delete the killed node's data directory (keeping the files beam cluster init wrote) before it starts again, as a fresh member")
	fs.BoolVar(&f.chaosRestart, "chaos-restart", true, "with --chaos --cluster-nodes 3: start the killed node again after --chaos-restart-delay; false leaves it down")
	fs.DurationVar(&f.chaosDelay, "chaos-restart-delay", 20*time.Second, "with --chaos --cluster-nodes 3: how long the killed node stays down (the default outlasts its cluster entry's expiry and the takeover grace, so its work is taken over before it returns)")
	fs.DurationVar(&f.chaosSettle, "chaos-settle-timeout", 2*time.Minute, "with --chaos: how long to wait after the load for every message to be acked or dead-lettered")
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam bench", "beam bench [--url URL] [--mode ws|http|bus|federation|mesh|a2a|jobs] [--count N] [--concurrency C] [--cluster-nodes N] [--chaos] [--json]", stderr,
		"Registers real agents (each with its own Ed25519 key), sends signed intents that the",
		"recipients verify and answer with signed results, and prints intents/s, latency",
		"percentiles, errors and the server's CPU per intent and peak RSS. Without --url it",
		"starts `beam serve` on a temporary data directory and measures that process.",
		"",
		"--cluster-nodes N (modes ws, http, bus, mesh, jobs) starts N `beam serve --cluster`",
		"nodes, spreads the load over them and reports it next to the same load on one node.",
		"--chaos --cluster-nodes 3 [--chaos-kill-role owner|holder|home|all] [--chaos-delete-data]",
		"[--chaos-restart=false] runs the mixed chaos load on a 3-node cluster, SIGKILLs the node",
		"of that role, and checks that nothing acknowledged was lost, no job was fulfilled twice",
		"and every envelope finished once (exit status 1 on a violation).")
	var f benchFlags
	f.register(fs.FlagSet)
	var jf jobsBenchFlags
	jf.register(fs.FlagSet)
	if err := fs.parseNoArgs(args); err != nil {
		return err
	}
	logger, err := newLogger(stderr, f.logLevel, "text")
	if err != nil {
		return err
	}
	if f.mode == string(bench.ModeJobs) && !f.chaos {
		if f.clusterNodes != 0 && !clusterUsageOK(&f, stderr) {
			return errUsage
		}
		return benchJobs(ctx, &f, &jf, logger, stdout, stderr)
	}
	if f.restartEvents > 0 {
		return benchRestart(ctx, &f, logger, stdout, stderr)
	}
	if f.chaos {
		if f.url != "" {
			fmt.Fprintln(stderr, "beam bench: --chaos starts and kills its own server; it takes no --url")
			return errUsage
		}
		if f.clusterNodes != 0 {
			return benchClusterChaos(ctx, &f, logger, stdout, stderr)
		}
		return benchChaos(ctx, &f, logger, stdout, stderr)
	}

	if err := bench.CheckMode(bench.Mode(f.mode)); err != nil {
		if errors.Is(err, bench.ErrModeUnavailable) {
			return fmt.Errorf("mode %s is not available yet: this build has no %s support to benchmark", f.mode, f.mode)
		}
		fmt.Fprintf(stderr, "beam bench: %v\n", err)
		return errUsage
	}
	federated := bench.Mode(f.mode) == bench.ModeFederation
	if f.url != "" && federated && f.peerURL == "" {
		fmt.Fprintln(stderr, "beam bench: --mode federation with --url needs --peer-url, the second directory")
		return errUsage
	}
	if !federated && (f.peerURL != "" || f.peerServerPID != 0) {
		fmt.Fprintln(stderr, "beam bench: --peer-url and --peer-server-pid are for --mode federation")
		return errUsage
	}
	if f.clusterNodes != 0 && !clusterUsageOK(&f, stderr) {
		return errUsage
	}
	cfg := bench.Config{
		URL: f.url, Mode: bench.Mode(f.mode), Count: f.count, Concurrency: f.concurrency,
		Rate: f.rate, Duration: f.duration, Warmup: f.warmup,
		Senders: f.senders, Recipients: f.recipients, IdleAgents: f.idleAgents, IdleSettle: f.idleSettle,
		RegisterParallel: f.registerParallel, PayloadBytes: f.payloadBytes, Timeout: f.timeout,
		ServerPID: f.serverPID, OperatorToken: f.operatorToken, Logger: logger,
		PeerURL: f.peerURL, Domain: f.domain, PeerDomain: f.peerDomain, PeerServerPID: f.peerServerPID,
		Hops: f.hops,
	}
	if bench.Mode(f.mode) == bench.ModeA2A {
		if f.url != "" || f.clusterNodes != 0 {
			fmt.Fprintln(stderr, "beam bench: --mode a2a starts its own directory, whose declared pipeline routes through the run's recipients: drop --url")
			return errUsage
		}
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.Org = "bench" + hex.EncodeToString(b)
		if f.a2aPipelines, err = bench.A2APipelinesFile(cfg.Org, f.hops, f.recipients); err != nil {
			return err
		}
	}
	var single *bench.Summary // the same load on one node, before a cluster run
	if f.url == "" && federated {
		if f.serverPID != 0 || f.peerServerPID != 0 || f.peerURL != "" {
			fmt.Fprintln(stderr, "beam bench: --server-pid, --peer-server-pid and --peer-url need --url (without it the started servers are measured)")
			return errUsage
		}
		a, b, cleanup, err := startBenchFederation(ctx, &f, stderr)
		if err != nil {
			return err
		}
		defer cleanup()
		cfg.URL, cfg.ServerPID, cfg.PeerURL, cfg.PeerServerPID = a.URL, a.PID, b.URL, b.PID
		logger.Info("started two federated beam serve", "alpha", a.URL, "beta", b.URL)
	} else if f.clusterNodes > 0 {
		if f.compareSingle {
			if single, err = benchOneNode(ctx, &f, cfg, logger, stderr); err != nil {
				return err
			}
		}
		nodes, cleanup, err := startBenchCluster(ctx, &f, stderr, nil, nil)
		if err != nil {
			return err
		}
		defer cleanup()
		for _, n := range nodes {
			cfg.NodeURLs, cfg.NodePIDs = append(cfg.NodeURLs, n.URL), append(cfg.NodePIDs, n.PID)
			cfg.NodeTokens = append(cfg.NodeTokens, n.OperatorToken)
		}
		cfg.Domain = bench.DefaultClusterDomain
		logger.Info("started beam serve cluster", "nodes", cfg.NodeURLs)
	} else if f.url == "" {
		if f.serverPID != 0 {
			fmt.Fprintln(stderr, "beam bench: --server-pid needs --url (without it the started server is measured)")
			return errUsage
		}
		srv, cleanup, err := startBenchServer(ctx, &f, stderr)
		if err != nil {
			return err
		}
		defer cleanup()
		cfg.URL, cfg.ServerPID = srv.URL, srv.PID
		cfg.OperatorToken = srv.OperatorToken
		logger.Info("started beam serve", "url", srv.URL, "pid", srv.PID, "ready", srv.Ready)
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	sum, err := bench.Run(ctx, cfg)
	if sum != nil && single != nil {
		sum.CompareSingle(single)
	}
	if sum != nil {
		if f.url == "" {
			sum.Notes = append(sum.Notes, "server started by beam bench with --sqlite-synchronous "+strings.ToUpper(f.synchronous))
		}
		if f.clusterNodes > 0 {
			spread := "agents spread round-robin"
			if m := bench.Mode(f.mode); m != bench.ModeWS && m != bench.ModeHTTP {
				spread = "senders on the first node, recipients on the others"
			}
			sum.Notes = append(sum.Notes, fmt.Sprintf("%d cluster nodes of %s; %s, server figures summed over the nodes", f.clusterNodes, bench.DefaultClusterDomain, spread))
		}
		if federated {
			sum.Notes = append(sum.Notes, "senders on "+cfg.URL+" ("+f.domain+"), recipients on "+cfg.PeerURL+" ("+f.peerDomain+"); server figures are the senders' directory's")
		}
		if f.json {
			if werr := sum.WriteJSON(stdout); werr != nil {
				return werr
			}
		} else if werr := sum.WriteTable(stdout); werr != nil {
			return werr
		}
	}
	return err
}

// startBenchServer starts beam serve for a run without --url and returns
// it with a function that stops it and removes a temporary data directory.
func startBenchServer(ctx context.Context, f *benchFlags, stderr io.Writer) (*bench.ServerProcess, func(), error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find the beam binary: %w", err)
	}
	dir, remove := f.dataDir, func() {}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "beam-bench-"); err != nil {
			return nil, nil, fmt.Errorf("data directory: %w", err)
		}
		remove = func() { _ = os.RemoveAll(dir) }
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("data directory: %w", err)
	}
	opts := bench.ServerOptions{Binary: bin, DataDir: dir, Synchronous: f.synchronous, Args: []string{"--log-level", "warn", "--open-orgs"}}
	if f.a2aPipelines != nil {
		path := filepath.Join(dir, "pipelines.json")
		if err := os.WriteFile(path, f.a2aPipelines, 0o600); err != nil {
			remove()
			return nil, nil, fmt.Errorf("pipelines file: %w", err)
		}
		opts.Args = append(opts.Args, "--pipelines", path)
	}
	if f.serverLog {
		opts.Output = stderr
	}
	srv, err := bench.StartServer(ctx, opts)
	if err != nil {
		remove()
		return nil, nil, err
	}
	return srv, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Stop(sctx); err != nil {
			fmt.Fprintf(stderr, "beam bench: %v\n", err)
		}
		remove()
	}, nil
}

// benchRestart seeds a log and times restarts of beam serve on it.
func benchRestart(ctx context.Context, f *benchFlags, logger *slog.Logger, stdout, stderr io.Writer) error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the beam binary: %w", err)
	}
	dir := f.dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "beam-bench-restart-"); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		defer os.RemoveAll(dir)
	} else if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("--data-dir %s is not empty; --restart-events seeds a fresh log", dir)
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	opts := bench.ServerOptions{Binary: bin, DataDir: dir, Synchronous: f.synchronous, Args: []string{"--log-level", "warn", "--open-orgs"}}
	if f.serverLog {
		opts.Output = stderr
	}
	logger.Info("seeding the log", "events", f.restartEvents, "dir", dir)
	sum, err := bench.MeasureRestart(ctx, opts, bench.SeedOptions{Events: f.restartEvents, InFlightEvery: f.inFlightEvery})
	if err != nil {
		return err
	}
	if f.json {
		b, err := json.Marshal(sum)
		if err != nil {
			return fmt.Errorf("encode summary: %w", err)
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	}
	rss := "n/a"
	if sum.RestartRSSMB != nil {
		rss = fmt.Sprintf("%.1f", *sum.RestartRSSMB)
	}
	fmt.Fprintf(stdout, "events\tintents\tin flight\tseed s\tfirst start s\trestart s\trestart rss MB\n")
	fmt.Fprintf(stdout, "%d\t%d\t%d\t%.2f\t%.3f\t%.3f\t%s\n", sum.Events, sum.Intents, sum.InFlight, sum.SeedS, sum.FirstStartS, sum.RestartS, rss)
	return nil
}

// startBenchFederation starts two federated beam serve processes for a
// federation run without --url and returns them with a function that stops
// both and removes their temporary data directories.
func startBenchFederation(ctx context.Context, f *benchFlags, stderr io.Writer) (*bench.ServerProcess, *bench.ServerProcess, func(), error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find the beam binary: %w", err)
	}
	root := f.dataDir
	remove := func() {}
	if root == "" {
		if root, err = os.MkdirTemp("", "beam-bench-fed-"); err != nil {
			return nil, nil, nil, fmt.Errorf("data directory: %w", err)
		}
		remove = func() { _ = os.RemoveAll(root) }
	}
	dirA, dirB := filepath.Join(root, "alpha"), filepath.Join(root, "beta")
	for _, d := range []string{dirA, dirB} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			remove()
			return nil, nil, nil, fmt.Errorf("data directory: %w", err)
		}
	}
	opts := bench.FederationOptions{
		Server:  bench.ServerOptions{Binary: bin, Synchronous: f.synchronous, Args: []string{"--log-level", "warn", "--open-orgs"}},
		DataDir: dirA, PeerDataDir: dirB, Domain: f.domain, PeerDomain: f.peerDomain,
	}
	if f.serverLog {
		opts.Server.Output = stderr
	}
	a, b, err := bench.StartFederation(ctx, opts)
	if err != nil {
		remove()
		return nil, nil, nil, err
	}
	return a, b, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, p := range []*bench.ServerProcess{a, b} {
			if err := p.Stop(sctx); err != nil {
				fmt.Fprintf(stderr, "beam bench: %v\n", err)
			}
		}
		remove()
	}, nil
}

// errChaosFailed is returned when a chaos run broke an invariant.
var errChaosFailed = errors.New("chaos: invariants violated")

// benchChaos runs beam bench --chaos and prints its report.
func benchChaos(ctx context.Context, f *benchFlags, logger *slog.Logger, stdout, stderr io.Writer) error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the beam binary: %w", err)
	}
	dir := f.dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "beam-bench-chaos-"); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		defer os.RemoveAll(dir)
	} else if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("--data-dir %s is not empty; --chaos needs a fresh one", dir)
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	cfg := bench.ChaosConfig{
		Binary: bin, DataDir: dir, Duration: f.chaosDuration, Kills: f.chaosKills, Seed: f.chaosSeed,
		Rate: f.chaosRate, Workers: f.chaosWorkers, SettleTimeout: f.chaosSettle, Mixed: f.chaosMix,
		Synchronous: f.synchronous, Logger: logger,
	}
	if f.serverLog {
		cfg.Output = stderr
	}
	if cfg.Seed == 0 {
		cfg.Seed = bench.RandomSeed()
	}
	// Printed first, so a run that hangs or crashes can be repeated.
	fmt.Fprintf(stderr, "beam bench --chaos: seed %d (repeat with --chaos-seed %d)\n", cfg.Seed, cfg.Seed)
	rep, err := bench.RunChaos(ctx, cfg)
	if rep != nil {
		if f.json {
			b, jerr := json.Marshal(rep)
			if jerr != nil {
				return fmt.Errorf("encode chaos report: %w", jerr)
			}
			if _, werr := fmt.Fprintln(stdout, string(b)); werr != nil {
				return werr
			}
		} else if werr := rep.WriteText(stdout); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	if !rep.OK() {
		return errChaosFailed
	}
	return nil
}

// startCPUProfile profiles this process into path until the returned
// function is called.
func startCPUProfile(path string) (func(), error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = out.Close()
	}, nil
}
