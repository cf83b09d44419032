package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// acceptCounter is implemented by drivers that can tell sends the
// directory accepted apart from completed ones (the bus).
type acceptCounter interface {
	Accepted() int64
	Polled() int64
}

// Bounds of a run's configuration.
const (
	maxCount        = 100_000_000
	maxConcurrency  = 10_000
	maxAgents       = 1_000
	maxIdleAgents   = 100_000
	maxPayloadBytes = 32 << 10
)

// Config describes one run.
type Config struct {
	// URL is the directory's base URL, e.g. http://127.0.0.1:3100.
	URL string
	// Mode is how intents are sent (ws, http, …).
	Mode Mode
	// Count is the number of intents of a burn-down run.
	Count int
	// Concurrency is how many intents are in flight at most.
	Concurrency int
	// Rate, when positive, makes the run steady-rate: Rate intents per
	// second for Duration, at most Concurrency in flight. Latency is then
	// measured from each intent's scheduled time, so a server that falls
	// behind shows it.
	Rate     float64
	Duration time.Duration
	// Warmup intents are sent before the measurement and not counted.
	Warmup int
	// Senders and Recipients are how many agents send and answer
	// (defaults: min(Concurrency, 8) each).
	Senders, Recipients int
	// IdleAgents are registered and connected, then left idle for the whole
	// run; the server's RSS is sampled once they are all connected.
	IdleAgents int
	// IdleSettle, when positive, is how long the idle agents stay idle
	// before the server's RSS is read again (the settled figures): the
	// first reading is taken as soon as they are connected, while the
	// garbage of the connects is still part of the RSS.
	IdleSettle time.Duration
	// RegisterParallel bounds concurrent registrations (default 16).
	RegisterParallel int
	// PayloadBytes is the size of the filler string in each intent's
	// payload (default 64).
	PayloadBytes int
	// Timeout bounds each intent (default 35 s).
	Timeout time.Duration
	// Org is the organization of every agent (default bench<random>).
	Org string
	// ServerPID, when positive, is the server's process, read from /proc
	// for CPU per intent and RSS.
	ServerPID int
	// OperatorToken, when set, is the server's operator token: an idle
	// agents run then reads the server's /metrics to break its memory per
	// agent down.
	OperatorToken string
	// Hops is the route length of a mesh run (defaultHops).
	Hops int
	// PeerURL is the second directory of a federation run: senders
	// register with URL, recipients with PeerURL.
	PeerURL string
	// Domain and PeerDomain are the federation domains of URL and PeerURL
	// (defaults alpha.beam.directory and beta.beam.directory); the agents
	// of a federation run are named in them.
	Domain, PeerDomain string
	// PeerServerPID, when positive, is PeerURL's process, read like
	// ServerPID.
	PeerServerPID int
	// NodeURLs, when set, are the nodes of one cluster serving Domain
	// (default cluster.beam.directory): senders and recipients register
	// and connect round-robin over them, so most intents cross nodes. URL
	// defaults to the first.
	NodeURLs []string
	// NodePIDs are NodeURLs' processes on this machine (same order), read
	// for CPU per intent; ServerPID is then ignored.
	NodePIDs []int
	// NodeTokens are NodeURLs' operator tokens (same order), used to wait
	// until every node sees every recipient's session before the run.
	NodeTokens []string
	// Clock is the time source for frame timestamps; nil means time.Now.
	Clock func() time.Time
	// Logger receives progress logs; nil discards them.
	Logger *slog.Logger

	payloadJSON json.RawMessage
}

// withDefaults fills in defaults and checks bounds.
func (c Config) withDefaults() (Config, error) {
	if len(c.NodeURLs) > 0 {
		var err error
		if c, err = c.clusterDefaults(); err != nil {
			return c, err
		}
	}
	if c.URL == "" {
		return c, errors.New("bench: no directory URL")
	}
	c.URL = strings.TrimRight(c.URL, "/")
	if c.Mode == "" {
		c.Mode = ModeWS
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.Concurrency > maxConcurrency {
		return c, fmt.Errorf("bench: concurrency %d exceeds %d", c.Concurrency, maxConcurrency)
	}
	if c.Count < 0 || c.Count > maxCount {
		return c, fmt.Errorf("bench: count %d out of range 0..%d", c.Count, maxCount)
	}
	if c.Rate < 0 {
		return c, fmt.Errorf("bench: negative rate %v", c.Rate)
	}
	if c.Rate > 0 {
		if c.Duration <= 0 {
			return c, errors.New("bench: a steady-rate run needs a duration")
		}
		n := c.Rate * c.Duration.Seconds()
		if n > maxCount {
			return c, fmt.Errorf("bench: rate × duration = %.0f intents exceeds %d", n, maxCount)
		}
		c.Count = int(n)
	}
	if c.Senders <= 0 {
		c.Senders = min(c.Concurrency, 8)
	}
	if c.Recipients <= 0 {
		c.Recipients = min(c.Concurrency, 8)
	}
	if c.Senders > maxAgents || c.Recipients > maxAgents {
		return c, fmt.Errorf("bench: at most %d senders and %d recipients", maxAgents, maxAgents)
	}
	if c.IdleSettle < 0 {
		return c, fmt.Errorf("bench: negative idle settle time %v", c.IdleSettle)
	}
	if c.IdleAgents < 0 || c.IdleAgents > maxIdleAgents {
		return c, fmt.Errorf("bench: idle agents %d out of range 0..%d", c.IdleAgents, maxIdleAgents)
	}
	if c.Warmup < 0 || c.Warmup > maxCount {
		return c, fmt.Errorf("bench: warmup %d out of range", c.Warmup)
	}
	if c.RegisterParallel <= 0 {
		c.RegisterParallel = 16
	}
	if c.PayloadBytes == 0 {
		c.PayloadBytes = 64
	}
	if c.PayloadBytes < 0 || c.PayloadBytes > maxPayloadBytes {
		return c, fmt.Errorf("bench: payload bytes %d out of range 0..%d", c.PayloadBytes, maxPayloadBytes)
	}
	if c.Timeout <= 0 {
		c.Timeout = 35 * time.Second
	}
	if c.Org == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.Org = "bench" + hex.EncodeToString(b)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	p, err := json.Marshal(map[string]string{"task": "bench", "fill": strings.Repeat("x", c.PayloadBytes)})
	if err != nil {
		return c, fmt.Errorf("bench: payload: %w", err)
	}
	c.payloadJSON = p
	if c.Mode == ModeFederation {
		if c.PeerURL == "" {
			return c, errors.New("bench: a federation run needs the second directory's URL (--peer-url)")
		}
		c.PeerURL = strings.TrimRight(c.PeerURL, "/")
		if c.Domain == "" {
			c.Domain = "alpha." + wire.BeamDomain
		}
		if c.PeerDomain == "" {
			c.PeerDomain = "beta." + wire.BeamDomain
		}
		for _, d := range []string{c.Domain, c.PeerDomain} {
			if _, err := orgOfDomain(d); err != nil {
				return c, err
			}
		}
		if c.Domain == c.PeerDomain {
			return c, fmt.Errorf("bench: both directories have the domain %s", c.Domain)
		}
	}
	return c, nil
}

// clusterDefaults checks and fills in a cluster run's fields.
func (c Config) clusterDefaults() (Config, error) {
	if c.Mode != "" && !slices.Contains(ClusterModes, c.Mode) {
		return c, fmt.Errorf("bench: a cluster run supports modes %v, not %s", ClusterModes, c.Mode)
	}
	if len(c.NodePIDs) > 0 && len(c.NodePIDs) != len(c.NodeURLs) {
		return c, fmt.Errorf("bench: %d node processes for %d nodes", len(c.NodePIDs), len(c.NodeURLs))
	}
	for i, u := range c.NodeURLs {
		c.NodeURLs[i] = strings.TrimRight(u, "/")
	}
	if c.URL == "" {
		c.URL = c.NodeURLs[0]
	}
	if c.Domain == "" {
		c.Domain = DefaultClusterDomain
	}
	if _, err := orgOfDomain(c.Domain); err != nil {
		return c, err
	}
	return c, nil
}

// orgOfDomain returns the organization part of a directory domain
// ("alpha" of alpha.beam.directory).
func orgOfDomain(domain string) (string, error) {
	id, err := wire.ParseBeamID("x@" + domain)
	if err != nil || id.Org == "" {
		return "", fmt.Errorf("bench: domain %q is not ORG.%s", domain, wire.BeamDomain)
	}
	return id.Org, nil
}

// placement says where the senders and recipients of a run register and
// connect: both on URL in cfg.Org, or for federation senders on URL in
// Domain and recipients on PeerURL in PeerDomain.
type placement struct {
	sendURLs            []string
	sendOrg, sendPrefix string
	recvURLs            []string
	recvOrg, recvPrefix string
}

func (c Config) placement() placement {
	if len(c.NodeURLs) > 0 {
		// The agents of a cluster live in its domain's organization.
		org, _ := orgOfDomain(c.Domain)
		if c.Mode == modeBus || c.Mode == modeMesh {
			// Senders (envelope creators) on the first node, recipients
			// (actors) on the others: every message and every hop crosses
			// a node boundary.
			return placement{c.NodeURLs[:1], org, "s" + c.Org, c.NodeURLs[1:], org, "r" + c.Org}
		}
		return placement{c.NodeURLs, org, "s" + c.Org, c.NodeURLs, org, "r" + c.Org}
	}
	if c.Mode != ModeFederation {
		return placement{[]string{c.URL}, c.Org, "s", []string{c.URL}, c.Org, "r"}
	}
	so, _ := orgOfDomain(c.Domain)
	ro, _ := orgOfDomain(c.PeerDomain)
	// Agents live in the directories' own organizations: a per-run tag in
	// their names keeps runs apart.
	return placement{[]string{c.URL}, so, "s" + c.Org, []string{c.PeerURL}, ro, "r" + c.Org}
}

func (c Config) payload() json.RawMessage { return c.payloadJSON }

// newHTTPClient returns a client that keeps enough idle connections to the
// one directory for conns requests in flight.
func newHTTPClient(conns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns + 16,
		MaxIdleConnsPerHost: conns + 16,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

// Run registers the fleet, connects it, runs the configured load and
// returns its summary. A failed intent counts as an error in the summary;
// Run itself fails only when the run cannot be set up.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	factory, err := factoryFor(cfg.Mode)
	if err != nil {
		return nil, err
	}
	lg := cfg.Logger
	hc := newHTTPClient(cfg.Concurrency + cfg.RegisterParallel)
	defer hc.CloseIdleConnections()

	began := time.Now()
	fctx, stop := context.WithCancel(context.Background())
	fleet := &fleet{Org: cfg.Org, base: cfg.URL, hc: hc, keys: map[string]ed25519.PublicKey{}, ctx: fctx, stop: stop}
	defer fleet.Close()
	lg.Info("registering agents", "senders", cfg.Senders, "recipients", cfg.Recipients, "org", cfg.Org)
	pl := cfg.placement()
	if fleet.Senders, err = registerMany(ctx, hc, pl.sendURLs, pl.sendOrg, pl.sendPrefix, cfg.Senders, cfg.RegisterParallel); err != nil {
		return nil, err
	}
	if fleet.Recipients, err = registerMany(ctx, hc, pl.recvURLs, pl.recvOrg, pl.recvPrefix, cfg.Recipients, cfg.RegisterParallel); err != nil {
		return nil, err
	}
	for _, a := range append(append([]*agent(nil), fleet.Senders...), fleet.Recipients...) {
		fleet.keys[a.BeamID] = a.Public
	}
	// Each node of a cluster has its own attestation key, and a hop or a
	// bus delivery may be attested by the node that owns it: trust every
	// node's.
	fleet.attestKeys = map[string]ed25519.PublicKey{}
	for _, base := range slices.Compact(slices.Sorted(slices.Values(slices.Concat(pl.recvURLs, pl.sendURLs)))) {
		keys, err := attestationKeys(ctx, hc, base)
		if err != nil {
			return nil, err
		}
		maps.Copy(fleet.attestKeys, keys)
	}
	for _, a := range fleet.Recipients {
		conn, err := dial(ctx, hc, a.Base, a)
		if err != nil {
			return nil, err
		}
		fleet.track(conn)
		fleet.wg.Add(1)
		go fleet.serveRecipient(conn, a, cfg.Clock)
	}
	if len(cfg.NodeURLs) > 0 {
		if err := awaitClusterSessions(ctx, hc, cfg, fleet.Recipients); err != nil {
			return nil, err
		}
	}

	sum := &Summary{
		Mode: cfg.Mode, Count: cfg.Count, Concurrency: cfg.Concurrency,
		Senders: cfg.Senders, Recipients: cfg.Recipients, IdleAgents: cfg.IdleAgents,
		PayloadBytes: cfg.PayloadBytes, ErrorCodes: map[string]int64{},
	}
	if cfg.Rate > 0 {
		sum.Rate, sum.DurationS = cfg.Rate, cfg.Duration.Seconds()
	}
	if len(cfg.NodePIDs) > 0 {
		cfg.ServerPID = 0 // every node is measured instead
	}
	if cfg.ServerPID > 0 {
		pid := cfg.ServerPID
		sum.ServerPID = &pid
	}
	if cfg.PeerServerPID > 0 {
		pid := cfg.PeerServerPID
		sum.PeerServerPID = &pid
	}

	if cfg.IdleAgents > 0 {
		if err := runIdle(ctx, fleet, cfg, sum); err != nil {
			return nil, err
		}
	}

	driver, err := factory(ctx, &env{URL: cfg.URL, Fleet: fleet, HTTP: hc, Config: cfg, Clock: cfg.Clock})
	if err != nil {
		return nil, fmt.Errorf("mode %s: %w", cfg.Mode, err)
	}
	defer driver.Close()
	sum.SetupS = round3(time.Since(began).Seconds())

	if cfg.Warmup > 0 && cfg.Count > 0 {
		lg.Info("warming up", "intents", cfg.Warmup)
		burnDown(ctx, driver, fleet, cfg, cfg.Warmup, newRecorder())
	}

	var before, peerBefore procSample
	if cfg.ServerPID > 0 {
		if before, err = readProc(cfg.ServerPID); err != nil {
			sum.Notes = append(sum.Notes, "server process: "+err.Error())
		}
	}
	if cfg.PeerServerPID > 0 {
		if peerBefore, err = readProc(cfg.PeerServerPID); err != nil {
			sum.Notes = append(sum.Notes, "peer server process: "+err.Error())
		}
	}
	nodesBefore := sampleNodes(cfg.NodePIDs, sum)
	counter, _ := driver.(acceptCounter)
	var acceptedBefore, polledBefore int64
	if counter != nil {
		acceptedBefore, polledBefore = counter.Accepted(), counter.Polled()
	}
	self, selfErr := readProc(os.Getpid())
	rec := newRecorder()
	t0 := time.Now()
	if cfg.Count > 0 {
		lg.Info("running", "mode", cfg.Mode, "count", cfg.Count, "concurrency", cfg.Concurrency, "rate", cfg.Rate)
		if cfg.Rate > 0 {
			steadyRate(ctx, driver, fleet, cfg, rec)
		} else {
			burnDown(ctx, driver, fleet, cfg, cfg.Count, rec)
		}
	}
	elapsed := time.Since(t0)
	lat := rec.Snapshot()
	sum.fill(lat, elapsed)
	if counter != nil {
		n := counter.Accepted() - acceptedBefore
		sum.Accepted = &n
		if elapsed > 0 {
			v := math.Round(float64(n)/elapsed.Seconds()*10) / 10
			sum.SentPerSecond = &v
		}
		if p := counter.Polled() - polledBefore; p > 0 {
			sum.Notes = append(sum.Notes, fmt.Sprintf("%d acks were observed by polling the message instead of the sender's notification", p))
		}
	}
	if cfg.PeerServerPID > 0 && !peerBefore.At.IsZero() {
		if after, err := readProc(cfg.PeerServerPID); err != nil {
			sum.Notes = append(sum.Notes, "peer server process: "+err.Error())
		} else {
			sum.setPeerServer(peerBefore, after, lat.OK+lat.Errors)
		}
	}
	if selfAfter, err := readProc(os.Getpid()); err == nil && selfErr == nil && lat.OK+lat.Errors > 0 {
		v := round3(float64(selfAfter.CPU-self.CPU) / float64(time.Millisecond) / float64(lat.OK+lat.Errors))
		sum.ClientCPUmsPerIntent = &v
	}
	if cfg.ServerPID > 0 && !before.At.IsZero() {
		after, err := readProc(cfg.ServerPID)
		if err != nil {
			sum.Notes = append(sum.Notes, "server process: "+err.Error())
		} else {
			sum.setServer(before, after, lat.OK+lat.Errors)
		}
	} else if len(cfg.NodeURLs) > 0 {
		sum.setCluster(cfg, fleet, nodesBefore, sampleNodes(cfg.NodePIDs, sum), lat.OK+lat.Errors)
	} else if cfg.ServerPID <= 0 {
		sum.Notes = append(sum.Notes, "server CPU and RSS not measured: the server's process is unknown (run without --url, or pass --server-pid)")
	}
	sum.Ed25519VerifyMs, sum.ServerCPUVerifies = floorFields(verifyFloor(), sum.ServerCPUmsPerIntent)
	if n := fleet.RecipientErrors(); n > 0 {
		sum.RecipientErrors = n
	}
	if err := ctx.Err(); err != nil {
		return sum, fmt.Errorf("bench interrupted: %w", err)
	}
	if cfg.Mode == modeMesh || cfg.Mode == ModeA2A {
		sum.Hops = cfg.Hops
		if sum.Hops <= 0 {
			sum.Hops = defaultHops
		}
		v := math.Round(sum.IntentsPerSecond*float64(sum.Hops)*10) / 10
		sum.HopsPerSecond = &v
		if sum.ServerCPUmsPerIntent != nil {
			c := math.Round(*sum.ServerCPUmsPerIntent/float64(sum.Hops)*1000) / 1000
			sum.ServerCPUmsPerHop = &c
		}
	}
	return sum, nil
}

// pair picks the sender and recipient of the i-th intent so that every
// sender talks to every recipient.
func pair(f *fleet, i int) (*agent, *agent) {
	s := len(f.Senders)
	return f.Senders[i%s], f.Recipients[(i/s)%len(f.Recipients)]
}

// sendOne sends one intent and records its outcome, with latency measured
// from start.
func sendOne(ctx context.Context, d driver, f *fleet, cfg Config, i int, start time.Time, rec *recorder) {
	from, to := pair(f, i)
	ictx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	err := d.Send(ictx, from, to)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // interrupted, not a failure of the directory
		}
		rec.Failure(codeOf(err))
		cfg.Logger.Debug("intent failed", "err", err)
		return
	}
	rec.Success(time.Since(start))
}

// burnDown sends n intents with cfg.Concurrency in flight.
func burnDown(ctx context.Context, d driver, f *fleet, cfg Config, n int, rec *recorder) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(cfg.Concurrency, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				sendOne(ctx, d, f, cfg, i, time.Now(), rec)
			}
		}()
	}
	wg.Wait()
}

// steadyRate starts cfg.Count intents on a fixed schedule of cfg.Rate per
// second with at most cfg.Concurrency in flight; latency counts from each
// intent's scheduled time.
func steadyRate(ctx context.Context, d driver, f *fleet, cfg Config, rec *recorder) {
	slots := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := 0; i < cfg.Count; i++ {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-slots }()
			sendOne(ctx, d, f, cfg, i, at, rec)
		}(i)
	}
	wg.Wait()
}
