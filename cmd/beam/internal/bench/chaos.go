package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// Bounds of a chaos run.
const (
	maxChaosKills   = 1000
	maxChaosAgents  = 100
	maxChaosWorkers = 1000
)

// chaosIntent is the intent type of every chaos message.
const chaosIntent = "chaos.task"

// ChaosConfig describes a chaos run: a mixed durable load on a `beam serve`
// child process that is SIGKILLed and restarted on the same data directory
// at random points.
type ChaosConfig struct {
	// Binary is the beam executable.
	Binary string
	// DataDir is the server's data directory; it must exist and hold no
	// log yet.
	DataDir string
	// Duration is the length of the load phase (default 5 min).
	Duration time.Duration
	// Kills is how many times the server is SIGKILLed during the load
	// (default 3).
	Kills int
	// Seed seeds the kill schedule, the restart delays and the load's
	// choices; 0 picks one at random (the report prints it).
	Seed uint64
	// Rate bounds the sends per second (default 200); Workers bounds the
	// sends in flight (default 16).
	Rate    float64
	Workers int
	// Senders, Online and Late are how many sending agents, recipients
	// connected from the start and recipients that connect only during
	// the run there are (defaults 4, 3, 2). One more recipient fails
	// FlakyPercent of its deliveries (default 50) to exercise retries
	// and dead letters.
	Senders, Online, Late int
	FlakyPercent          int
	// SettleTimeout bounds the wait, after the load, for every message to
	// be acked or dead-lettered (default 2 min).
	SettleTimeout time.Duration
	// Mixed adds to the durable bus sends synchronous intents, Intent
	// Protocol jobs (published, claimed and fulfilled or failed over the
	// job bus's signed HTTP API by workers of the run) and pipeline
	// envelopes routed through actor agents, and checks that none acknowledged is lost, no
	// job is fulfilled twice and every envelope finishes exactly once
	// (invariants e–g, counts in ChaosReport.Mix).
	Mixed bool
	// Synchronous is the server's --sqlite-synchronous (default FULL).
	Synchronous string
	// ServerArgs are extra flags for beam serve.
	ServerArgs []string
	// Output receives the server's log; nil discards it.
	Output io.Writer
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

func (c ChaosConfig) withDefaults() (ChaosConfig, error) {
	if c.Binary == "" || c.DataDir == "" {
		return c, errors.New("chaos: binary and data directory are required")
	}
	if c.Duration <= 0 {
		c.Duration = 5 * time.Minute
	}
	if c.Kills < 0 || c.Kills > maxChaosKills {
		return c, fmt.Errorf("chaos: kills %d out of range 0..%d", c.Kills, maxChaosKills)
	}
	if c.Kills == 0 {
		c.Kills = 3
	}
	if c.Seed == 0 {
		c.Seed = RandomSeed()
	}
	if c.Rate < 0 {
		return c, fmt.Errorf("chaos: negative rate %v", c.Rate)
	}
	if c.Rate == 0 {
		c.Rate = 200
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.Workers > maxChaosWorkers {
		return c, fmt.Errorf("chaos: workers %d exceed %d", c.Workers, maxChaosWorkers)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Senders, 4)
	def(&c.Online, 3)
	def(&c.Late, 2)
	if c.Senders+c.Online+c.Late+1 > maxChaosAgents {
		return c, fmt.Errorf("chaos: at most %d agents", maxChaosAgents)
	}
	if c.FlakyPercent < 0 || c.FlakyPercent > 100 {
		return c, fmt.Errorf("chaos: flaky percent %d out of range 0..100", c.FlakyPercent)
	}
	if c.FlakyPercent == 0 {
		c.FlakyPercent = 50
	}
	if c.SettleTimeout <= 0 {
		c.SettleTimeout = 2 * time.Minute
	}
	if c.Synchronous == "" {
		c.Synchronous = "FULL"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// RandomSeed returns a random non-zero seed for ChaosConfig.Seed.
func RandomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	var s uint64
	for _, x := range b {
		s = s<<8 | uint64(x)
	}
	return max(s>>1, 1) // below 2^63, so it prints and parses as a plain integer anywhere
}

// ChaosKill is one SIGKILL of a chaos run.
type ChaosKill struct {
	// AtS is when the server was killed, in seconds since the load began.
	AtS float64 `json:"at_s"`
	// RestartS is how long the restarted server took to serve again.
	RestartS float64 `json:"restart_s"`
}

// Invariant is the outcome of one invariant check.
type Invariant struct {
	// Name says what was checked.
	Name string `json:"name"`
	// Checked is how many items were checked; Violations lists at most
	// maxViolations of those that broke it, ViolationCount counts all.
	Checked        int64    `json:"checked"`
	ViolationCount int64    `json:"violation_count"`
	Violations     []string `json:"violations,omitempty"`
}

// maxViolations bounds the violations an Invariant lists.
const maxViolations = 20

func (inv *Invariant) violate(format string, args ...any) {
	inv.ViolationCount++
	if len(inv.Violations) < maxViolations {
		inv.Violations = append(inv.Violations, fmt.Sprintf(format, args...))
	}
}

// ChaosReport is the outcome of a chaos run.
type ChaosReport struct {
	Seed      uint64      `json:"seed"`
	DurationS float64     `json:"duration_s"`
	Kills     []ChaosKill `json:"kills"`
	// Attempted is how many messages the load tried to send; Accepted how
	// many the bus answered 201 or 200 (on some try); SendFailures how many
	// were never accepted; Resends how many sends were repeated with the
	// same nonce after a failure.
	Attempted    int64            `json:"attempted"`
	Accepted     int64            `json:"accepted"`
	SendFailures map[string]int64 `json:"send_failures,omitempty"`
	Resends      int64            `json:"resends"`
	// Deliveries is how many intents the agents' handlers ran (retries
	// included); FlakyFailures how many the flaky agent failed on purpose.
	Deliveries    int64 `json:"deliveries"`
	FlakyFailures int64 `json:"flaky_failures"`
	// Settled is whether every message was acked or dead-lettered before
	// SettleTimeout; SettleS how long that took.
	Settled bool    `json:"settled"`
	SettleS float64 `json:"settle_s"`
	// Messages counts the log's messages by status at the end.
	Messages map[string]int64 `json:"messages"`
	// Mix counts the mixed load (ChaosConfig.Mixed); nil without it.
	Mix *ChaosMixReport `json:"mix,omitempty"`
	// Invariants are the checks, in order.
	Invariants []*Invariant `json:"invariants"`
}

// OK reports whether every invariant held.
func (r *ChaosReport) OK() bool {
	if len(r.Invariants) == 0 {
		return false
	}
	for _, inv := range r.Invariants {
		if inv.ViolationCount > 0 {
			return false
		}
	}
	return true
}

// WriteText writes the report as readable text ending in PASS or FAIL.
func (r *ChaosReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos seed %d, load %.1fs, %d kills\n", r.Seed, r.DurationS, len(r.Kills))
	for i, k := range r.Kills {
		fmt.Fprintf(&b, "  kill %d at %.2fs, serving again after %.2fs\n", i+1, k.AtS, k.RestartS)
	}
	fmt.Fprintf(&b, "messages: %d attempted, %d accepted, %d resent after a failed send, %d never accepted\n",
		r.Attempted, r.Accepted, r.Resends, r.Attempted-r.Accepted)
	if len(r.SendFailures) > 0 {
		fmt.Fprintf(&b, "  last error of sends never accepted: %s\n", countsString(r.SendFailures))
	}
	fmt.Fprintf(&b, "deliveries to agents: %d (%d failed on purpose by the flaky agent)\n", r.Deliveries, r.FlakyFailures)
	if r.Settled {
		fmt.Fprintf(&b, "settled: every message terminal %.1fs after the load\n", r.SettleS)
	} else {
		fmt.Fprintf(&b, "settled: NO, messages still in flight %.1fs after the load\n", r.SettleS)
	}
	fmt.Fprintf(&b, "log messages by status: %s\n", countsString(r.Messages))
	if m := r.Mix; m != nil {
		fmt.Fprintf(&b, "synchronous intents: %d sent, %d acknowledged\n", m.SyncAttempted, m.SyncAcked)
		fmt.Fprintf(&b, "jobs: %d publishes tried, %d acknowledged, %d fulfils and %d fails (on purpose) acknowledged; log jobs by status: %s\n",
			m.JobsAttempted, m.JobsPublished, m.JobsFulfilled, m.JobsFailed, countsString(m.JobsLog))
		fmt.Fprintf(&b, "envelopes: %d creates tried, %d acknowledged, %d hops failed on purpose; log envelopes by status: %s\n",
			m.EnvelopesAttempted, m.EnvelopesCreated, m.HopFailures, countsString(m.Envelopes))
		if len(m.Failures) > 0 {
			fmt.Fprintf(&b, "  last error of mixed operations never acknowledged: %s\n", countsString(m.Failures))
		}
	}
	for _, inv := range r.Invariants {
		verdict := "PASS"
		if inv.ViolationCount > 0 {
			verdict = "FAIL"
		}
		fmt.Fprintf(&b, "%s  %s (%d checked, %d violations)\n", verdict, inv.Name, inv.Checked, inv.ViolationCount)
		for _, v := range inv.Violations {
			fmt.Fprintf(&b, "        %s\n", v)
		}
	}
	if r.OK() {
		b.WriteString("CHAOS PASS\n")
	} else {
		b.WriteString("CHAOS FAIL\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func countsString(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// chaosAgent is one SDK client of the run and what it saw.
type chaosAgent struct {
	id     *agents.Identity
	apiKey string
	flaky  bool
	// setup adds the agent's handlers to a client (NewClient's).
	setup func(*agents.Client)

	mu     sync.Mutex
	client *agents.Client
	node   int    // the cluster node it is connected to (a cluster run)
	base   string // that node's (or the server's) URL
}

// cl returns the agent's current client.
func (a *chaosAgent) cl() *agents.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.client
}

// at returns the node the agent is connected to and its URL.
func (a *chaosAgent) at() (int, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.node, a.base
}

// chaosRun is the state of one run.
type chaosRun struct {
	cfg    ChaosConfig
	url    string
	busKey string
	hc     *http.Client
	opts   ServerOptions

	srvMu sync.Mutex
	srv   *ServerProcess
	mix   *chaosMix     // nil unless cfg.Mixed
	cl    *clusterChaos // nil unless a cluster run

	mu        sync.Mutex
	attempted map[string]string          // nonce → recipient
	accepted  map[string]bool            // nonce → accepted
	seen      map[string]map[string]bool // agent → nonces it saw
	misrouted []string                   // deliveries whose frame was for someone else
	failures  map[string]int64

	resends, deliveries, flakyFails atomic.Int64
}

// RunChaos runs a chaos scenario and checks its invariants. It returns an
// error only when the run could not be carried out; broken invariants are
// in the report (see ChaosReport.OK).
func RunChaos(ctx context.Context, cfg ChaosConfig) (*ChaosReport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	lg := cfg.Logger
	listen, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	r, err := newChaosRun(cfg, "4", nil)
	if err != nil {
		return nil, err
	}
	defer r.hc.CloseIdleConnections()
	r.opts.DataDir, r.opts.Listen = cfg.DataDir, listen
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x6368616f73))
	rep := &ChaosReport{Seed: cfg.Seed, Kills: []ChaosKill{}}

	srv, err := StartServer(ctx, r.opts)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	r.srv = srv
	r.url = srv.URL
	defer func() {
		r.srvMu.Lock()
		defer r.srvMu.Unlock()
		if r.srv != nil {
			r.srv.Kill()
		}
	}()
	lg.Info("chaos: server started", "url", r.url, "seed", cfg.Seed)

	org := "chaos" + r.busKey[len("chaos-"):][:8] // a tag of the run
	fl, err := r.newFleet(ctx, org)
	if err != nil {
		return nil, err
	}
	defer fl.close()
	senders, late := fl.senders, fl.late

	// The schedule: kill points in 10–85 % of the load and restart
	// delays (then, in startLoad, when each late agent connects).
	kills := make([]time.Duration, cfg.Kills)
	for i := range kills {
		kills[i] = time.Duration((0.10 + 0.75*rng.Float64()) * float64(cfg.Duration))
	}
	slices.Sort(kills)
	delays := make([]time.Duration, cfg.Kills)
	for i := range delays {
		delays[i] = time.Duration(rng.IntN(500)) * time.Millisecond
	}

	// The job workers claim and fulfil (or fail) until the load has
	// settled.
	tr := r.startTraffic(ctx, fl, rng)
	defer tr.cancel()
	began := tr.began

	// The killer runs on this goroutine.
	var runErr error
	for i, at := range kills {
		t := time.NewTimer(time.Until(began.Add(at)))
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			runErr = ctx.Err()
			break
		}
		k, err := r.killAndRestart(ctx, delays[i])
		if err != nil {
			runErr = err
			break
		}
		k.AtS = round3(at.Seconds())
		rep.Kills = append(rep.Kills, k)
		lg.Info("chaos: killed and restarted", "n", i+1, "at", at, "restart", k.RestartS)
	}
	if runErr == nil {
		t := time.NewTimer(time.Until(began.Add(cfg.Duration)))
		select {
		case <-t.C:
		case <-ctx.Done():
			runErr = ctx.Err()
		}
		t.Stop()
	}
	tr.endLoad()
	rep.DurationS = round3(time.Since(began).Seconds())
	if runErr != nil {
		return nil, fmt.Errorf("chaos: %w", runErr)
	}
	for _, a := range late {
		if !a.cl().Connected() {
			r.connectLate(ctx, a) // the load was too short to reach its time
		}
	}

	lg.Info("chaos: load stopped, waiting for messages to settle")
	settleStart := time.Now()
	rep.Settled = r.settle(ctx, senders)
	rep.SettleS = round3(time.Since(settleStart).Seconds())
	tr.endWork()

	fl.close()
	r.srvMu.Lock()
	srv, r.srv = r.srv, nil
	r.srvMu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	err = srv.Stop(sctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("chaos: stop the server: %w", err)
	}

	r.count(rep)
	if err := r.check(ctx, rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// chaosFleet is the agents of a chaos run.
type chaosFleet struct {
	senders, online, late, flaky []*chaosAgent
	all                          []*chaosAgent // the above and the actors
}

// close closes every agent's client.
func (f *chaosFleet) close() {
	for _, a := range f.all {
		_ = a.cl().Close()
	}
}

// newFleet registers the run's agents in org (and connects all but the
// late ones): senders, online recipients, late ones, the flaky one and,
// with the mix, the actors.
func (r *chaosRun) newFleet(ctx context.Context, org string) (*chaosFleet, error) {
	f := &chaosFleet{}
	var err error
	for _, g := range []struct {
		group    *[]*chaosAgent
		kind     string
		n, flaky int
		connect  bool
	}{
		{&f.senders, "sender", r.cfg.Senders, 0, true},
		{&f.online, "online", r.cfg.Online, 0, true},
		{&f.late, "late", r.cfg.Late, 0, false},
		{&f.flaky, "flaky", 1, 1, true},
	} {
		*g.group, err = r.newAgents(ctx, org, r.prefix(g.kind), g.n, g.flaky, g.connect)
		f.all = append(f.all, *g.group...)
		if err != nil {
			f.close()
			return nil, err
		}
	}
	if r.mix != nil {
		actors, err := r.mix.addActors(ctx, org)
		f.all = append(f.all, actors...)
		if err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

// chaosTraffic is a chaos run's load and job workers, started together.
type chaosTraffic struct {
	began              time.Time
	stopLoad, stopWork context.CancelFunc
	load, workers      sync.WaitGroup
}

// startTraffic starts the load of fleet f (paced from rng) and the job
// workers; the caller defers cancel.
func (r *chaosRun) startTraffic(ctx context.Context, f *chaosFleet, rng *mrand.Rand) *chaosTraffic {
	tr := &chaosTraffic{began: time.Now()}
	loadCtx, stopLoad := context.WithCancel(ctx)
	workCtx, stopWork := context.WithCancel(ctx)
	tr.stopLoad, tr.stopWork = stopLoad, stopWork
	r.startLoad(ctx, loadCtx, &tr.load, f, rng)
	r.startWorkers(workCtx, &tr.workers)
	return tr
}

// endLoad stops the load and waits for its workers to return.
func (tr *chaosTraffic) endLoad() { tr.stopLoad(); tr.load.Wait() }

// endWork stops the job workers and waits for them to return.
func (tr *chaosTraffic) endWork() { tr.stopWork(); tr.workers.Wait() }

// cancel stops both without waiting.
func (tr *chaosTraffic) cancel() { tr.stopLoad(); tr.stopWork() }

// startLoad starts, on wg, the load workers (until loadCtx ends) and the
// late agents' connects, each at a time drawn from rng in 20–70 % of the
// load.
func (r *chaosRun) startLoad(ctx, loadCtx context.Context, wg *sync.WaitGroup, f *chaosFleet, rng *mrand.Rand) {
	lateAt := make([]time.Duration, len(f.late))
	for i := range lateAt {
		lateAt[i] = time.Duration((0.20 + 0.50*rng.Float64()) * float64(r.cfg.Duration))
	}
	lim := rate.NewLimiter(rate.Limit(r.cfg.Rate), max(1, r.cfg.Workers))
	recipients := func(rg *mrand.Rand) *chaosAgent { return chaosRecipient(rg, f.online, f.late, f.flaky) }
	for w := range r.cfg.Workers {
		wg.Add(1)
		wrng := mrand.New(mrand.NewPCG(r.cfg.Seed, uint64(w)+1))
		go func() {
			defer wg.Done()
			r.loadLoop(ctx, loadCtx, lim, wrng, f.senders, f.online, recipients)
		}()
	}
	for i, a := range f.late {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if pause(loadCtx, lateAt[i]) || ctx.Err() == nil {
				r.connectLate(ctx, a)
			}
		}()
	}
}

// startWorkers starts, on wg, the mix's two job workers (until ctx ends).
func (r *chaosRun) startWorkers(ctx context.Context, wg *sync.WaitGroup) {
	if r.mix == nil {
		return
	}
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.mix.work(ctx, w)
		}()
	}
}

// count fills rep's counts of the load.
func (r *chaosRun) count(rep *ChaosReport) {
	r.mu.Lock()
	rep.Attempted = int64(len(r.attempted))
	rep.Accepted = int64(len(r.accepted))
	if len(r.failures) > 0 {
		rep.SendFailures = r.failures
	}
	r.mu.Unlock()
	rep.Resends = r.resends.Load()
	rep.Deliveries = r.deliveries.Load()
	rep.FlakyFailures = r.flakyFails.Load()
	if r.mix != nil {
		r.mix.report(rep)
	}
}

// chaosRecipient picks a durable message's recipient: 60 % an online
// agent, 20 % a late one, 20 % the flaky one.
func chaosRecipient(rg *mrand.Rand, online, late, flaky []*chaosAgent) *chaosAgent {
	switch x := rg.IntN(100); {
	case x < 60:
		return online[rg.IntN(len(online))]
	case x < 80:
		return late[rg.IntN(len(late))]
	default:
		return flaky[0]
	}
}

// loadLoop is one load worker: it sends, at lim's pace until loadCtx
// ends, durable messages from senders to recipients, and with the mix
// synchronous intents to online agents, job publishes and envelopes.
func (r *chaosRun) loadLoop(ctx, loadCtx context.Context, lim *rate.Limiter, rg *mrand.Rand,
	senders, online []*chaosAgent, recipients func(*mrand.Rand) *chaosAgent) {
	for lim.Wait(loadCtx) == nil {
		from := senders[rg.IntN(len(senders))]
		if r.mix == nil {
			r.sendOne(ctx, from, recipients(rg))
			continue
		}
		// The mix: 40 % bus sends, 20 % each synchronous intents, job
		// publishes and envelopes.
		switch x := rg.IntN(100); {
		case x < 40:
			r.sendOne(ctx, from, recipients(rg))
		case x < 60:
			r.mix.syncOne(ctx, from, online[rg.IntN(len(online))])
		case x < 80:
			r.mix.publishOne(ctx)
		default:
			r.mix.createEnvelope(ctx, from, rg.IntN(chaosHops))
		}
	}
}

// prefix is the name prefix of a kind of agent: kind, and in a cluster
// run (whose agents share the cluster's organization) kind-<run tag>.
func (r *chaosRun) prefix(kind string) string {
	if r.cl != nil {
		return kind + "-" + r.cl.tag
	}
	return kind
}

// newChaosRun returns a run of cfg: its bus key, the server options every
// node (or the one server) shares, with deliveries given up after
// maxAttempts, and with cfg.Mixed the mix. cl is the cluster side of a
// cluster run, nil for one server.
func newChaosRun(cfg ChaosConfig, maxAttempts string, cl *clusterChaos) (*chaosRun, error) {
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	r := &chaosRun{
		cfg: cfg, busKey: "chaos-" + hex.EncodeToString(key), hc: newHTTPClient(cfg.Workers + 32),
		attempted: map[string]string{}, accepted: map[string]bool{}, seen: map[string]map[string]bool{},
		failures: map[string]int64{}, cl: cl,
	}
	r.opts = ServerOptions{
		Binary: cfg.Binary, Synchronous: cfg.Synchronous, Output: cfg.Output,
		Args: append([]string{
			"--log-level", "warn",
			"--open-orgs", // the chaos fleet shares one org
			"--bus-retry-schedule", "200ms,400ms,800ms",
			"--bus-max-attempts", maxAttempts,
			"--bus-delivery-timeout", "5s",
			"--bus-tick-interval", "100ms",
			"--bus-api-key", r.busKey,
		}, cfg.ServerArgs...),
	}
	if cfg.Mixed {
		if err := r.setupMix(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// newAgents creates n SDK clients named prefix-i@org, registers them and,
// when connect is set, connects them; the first flaky of them fail on
// purpose. setup adds handlers to each client before it connects.
func (r *chaosRun) newAgents(ctx context.Context, org, prefix string, n, flaky int, connect bool,
	setup ...func(*chaosAgent, *agents.Client)) ([]*chaosAgent, error) {
	out := make([]*chaosAgent, 0, n)
	for i := range n {
		id, err := agents.GenerateIdentity(fmt.Sprintf("%s-%d@%s.beam.directory", prefix, i, org))
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		a := &chaosAgent{id: id, flaky: i < flaky, base: r.url}
		if r.cl != nil {
			a.node = r.cl.place(prefix, i)
			a.base = r.cl.nodeURL(a.node)
		}
		a.setup = func(c *agents.Client) {
			c.Handle(chaosIntent, r.handler(a))
			if r.mix != nil {
				c.Handle(chaosSyncIntent, r.mix.handleSync(a))
			}
			for _, f := range setup {
				f(a, c)
			}
		}
		c, err := r.newClient(a, a.base)
		if err != nil {
			return nil, err
		}
		a.client = c
		out = append(out, a)
		r.mu.Lock()
		r.seen[id.BeamID] = map[string]bool{}
		r.mu.Unlock()
		caps := []string{chaosIntent}
		if r.mix != nil {
			caps = append(caps, chaosSyncIntent, agents.MeshIntent)
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := c.Register(rctx, prefix, caps)
		cancel()
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("chaos: %w", err)
		}
		a.apiKey = res.APIKey
		if connect {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := c.Connect(cctx)
			cancel()
			if err != nil {
				_ = c.Close()
				return nil, fmt.Errorf("chaos: connect %s: %w", id.BeamID, err)
			}
		}
	}
	return out, nil
}

// newClient returns a client of a for the directory at base, with a's
// handlers.
func (r *chaosRun) newClient(a *chaosAgent, base string) (*agents.Client, error) {
	c, err := agents.NewClient(agents.ClientConfig{
		DirectoryURL: base, Identity: a.id, HTTPClient: r.hc,
		Logger:       slog.New(slog.DiscardHandler),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
		PingInterval: 2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	a.setup(c)
	return c, nil
}

// connectLate connects a late agent, trying again while the server is
// being restarted.
func (r *chaosRun) connectLate(ctx context.Context, a *chaosAgent) {
	for range 100 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := a.cl().Connect(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Debug("chaos: late connect failed", "agent", a.id.BeamID, "err", err)
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

// handler records what agent a saw and answers: success, or for the flaky
// agent a failure on a deterministic share of (nonce, attempt) pairs.
func (r *chaosRun) handler(a *chaosAgent) agents.Handler {
	me := a.id.BeamID
	return func(_ context.Context, in *agents.Intent) agents.Reply {
		r.deliveries.Add(1)
		r.mu.Lock()
		r.seen[me][in.Nonce] = true
		if in.To != me {
			r.misrouted = append(r.misrouted, fmt.Sprintf("%s got nonce %s addressed to %s", me, in.Nonce, in.To))
		}
		r.mu.Unlock()
		if a.flaky {
			attempt := 0
			if in.Durable != nil {
				attempt = in.Durable.Attempt
			}
			h := fnv.New32a()
			fmt.Fprintf(h, "%s/%d", in.Nonce, attempt)
			if int(h.Sum32()%100) < r.cfg.FlakyPercent {
				r.flakyFails.Add(1)
				return agents.Failure("CHAOS_FLAKY", "failing on purpose")
			}
		}
		return agents.Success(map[string]any{"ok": true})
	}
}

// sendOne sends one durable message from → to, repeating the same nonce
// (a deduplicated resend) when the server was unreachable or busy.
func (r *chaosRun) sendOne(ctx context.Context, from, to *chaosAgent) {
	nb := make([]byte, 16)
	_, _ = rand.Read(nb)
	nonce := "chaos-" + hex.EncodeToString(nb)
	r.mu.Lock()
	r.attempted[nonce] = to.id.BeamID
	r.mu.Unlock()
	payload := map[string]any{"n": nonce[6:14]}
	var last string
	for try := range 6 {
		if try > 0 {
			r.resends.Add(1)
			select {
			case <-time.After(time.Duration(100*try) * time.Millisecond):
			case <-ctx.Done():
				return
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := from.cl().SendDurable(sctx, to.id.BeamID, chaosIntent, payload, &agents.DurableOptions{Nonce: nonce})
		cancel()
		if err == nil {
			r.mu.Lock()
			r.accepted[nonce] = true
			r.mu.Unlock()
			return
		}
		var ae *agents.Error
		if errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 500 && ae.Code != "IN_PROGRESS" {
			last = ae.Code // a definite refusal: resending will not help
			break
		}
		if errors.As(err, &ae) {
			last = ae.Code
		} else {
			last = "UNREACHABLE"
		}
	}
	r.mu.Lock()
	r.failures[last]++
	r.mu.Unlock()
}

// killAndRestart SIGKILLs the server, waits delay and starts it again on
// the same data directory and address.
func (r *chaosRun) killAndRestart(ctx context.Context, delay time.Duration) (ChaosKill, error) {
	r.srvMu.Lock()
	defer r.srvMu.Unlock()
	r.srv.Kill()
	r.srv = nil
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return ChaosKill{}, ctx.Err()
	}
	t0 := time.Now()
	var srv *ServerProcess
	var err error
	for range 5 { // the port may still be held for a moment
		if srv, err = StartServer(ctx, r.opts); err == nil {
			break
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return ChaosKill{}, fmt.Errorf("restart after SIGKILL: %w", err)
	}
	r.srv = srv
	return ChaosKill{RestartS: round3(time.Since(t0).Seconds())}, nil
}

// settle waits until the bus reports every message acked or dead-lettered
// (and, with the mix, every published job is fulfilled or dead and no
// envelope of creators is open), or SettleTimeout passes.
func (r *chaosRun) settle(ctx context.Context, creators []*chaosAgent) bool {
	deadline := time.Now().Add(r.cfg.SettleTimeout)
	for {
		counts, err := r.busStats(ctx)
		if err == nil {
			open := counts["total"] - counts[string(tracing.Acked)] - counts[string(tracing.DeadLetter)]
			if open == 0 && (r.mix == nil || r.mix.settled(ctx, creators)) {
				return true
			}
			r.cfg.Logger.Debug("chaos: settling", "open", open)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
}

// busStats reads GET /v1/beam/stats with the bus key.
func (r *chaosRun) busStats(ctx context.Context) (map[string]int64, error) {
	_, b, err := call(ctx, r.hc, http.MethodGet, r.url+"/v1/beam/stats", nil,
		http.Header{"Authorization": {"Bearer " + r.busKey}}, http.StatusOK)
	if err != nil {
		return nil, fmt.Errorf("bus stats: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("bus stats: %w", err)
	}
	out := map[string]int64{}
	for k, v := range raw {
		var n int64
		if json.Unmarshal(v, &n) == nil {
			out[k] = n
		}
	}
	return out, nil
}

// check opens the stopped server's log and checks the invariants.
func (r *chaosRun) check(ctx context.Context, rep *ChaosReport) error {
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(r.cfg.DataDir, "beam.db"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("chaos: open the log: %w", err)
	}
	defer lg.Close()
	r.mu.Lock()
	defer r.mu.Unlock()

	// The log's messages and their status.
	status := map[string]string{}
	err = lg.EachMessage(ctx, tracing.MessageQuery{}, func(m *tracing.MessageRow) error {
		status[m.Nonce] = string(m.Status)
		return nil
	})
	if err != nil {
		return fmt.Errorf("chaos: read messages: %w", err)
	}
	rep.Messages = map[string]int64{}
	for _, s := range status {
		rep.Messages[s]++
	}

	// (a) every accepted message, and every message the log holds, ends
	// acked or dead_letter.
	a := &Invariant{Name: "(a) every accepted message is acked or dead_letter"}
	for nonce := range r.accepted {
		a.Checked++
		m, ok, err := lg.Message(ctx, nonce)
		switch {
		case err != nil:
			return fmt.Errorf("chaos: read message %s: %w", nonce, err)
		case !ok:
			a.violate("accepted nonce %s is not in the log", nonce)
		case m.Status != tracing.Acked && m.Status != tracing.DeadLetter:
			a.violate("accepted nonce %s ended %s", nonce, m.Status)
		}
	}
	for nonce, s := range status {
		if r.accepted[nonce] {
			continue
		}
		a.Checked++ // recorded though its send's answer was cut off
		if s != string(tracing.Acked) && s != string(tracing.DeadLetter) {
			a.violate("nonce %s (recorded, send answer lost) ended %s", nonce, s)
		}
	}
	rep.Invariants = append(rep.Invariants, a)

	// (b) each nonce's trace is a legal path from "".
	b := &Invariant{Name: "(b) each nonce's trace is a legal lifecycle path"}
	if err := checkTraces(ctx, lg, b); err != nil {
		return err
	}
	rep.Invariants = append(rep.Invariants, b)

	// (c) no agent saw a nonce it was not sent, and every acked message
	// was seen by its recipient.
	c := &Invariant{Name: "(c) no agent saw a nonce it was not sent; every acked message reached its recipient"}
	for agent, nonces := range r.seen {
		for nonce := range nonces {
			c.Checked++
			if to, ok := r.attempted[nonce]; !ok {
				c.violate("%s saw nonce %s that no one sent", agent, nonce)
			} else if to != agent {
				c.violate("%s saw nonce %s sent to %s", agent, nonce, to)
			}
		}
	}
	for _, m := range r.misrouted {
		c.violate("%s", m)
	}
	for nonce, s := range status {
		if s != string(tracing.Acked) {
			continue
		}
		c.Checked++
		to, ok := r.attempted[nonce]
		if !ok {
			c.violate("acked nonce %s was never sent by the load", nonce)
		} else if !r.seen[to][nonce] {
			c.violate("nonce %s is acked but %s never saw it", nonce, to)
		}
	}
	rep.Invariants = append(rep.Invariants, c)

	// (e)–(g) of the mixed load, read before the rebuild so that a drift
	// shows in (d) only.
	var mixed []*Invariant
	if r.mix != nil {
		if mixed, err = r.mix.check(ctx, lg, rep); err != nil {
			return err
		}
	}

	// (d) the projections equal a rebuild.
	d := &Invariant{Name: "(d) projections equal a rebuild"}
	if err := checkRebuild(ctx, lg, d); err != nil {
		return err
	}
	rep.Invariants = append(rep.Invariants, d)
	rep.Invariants = append(rep.Invariants, mixed...)
	return nil
}

// checkTraces streams every event in (nonce, seq) order and checks that
// consecutive states are legal transitions starting from "".
func checkTraces(ctx context.Context, lg *tracing.Log, inv *Invariant) error {
	var cur string
	var prev tracing.State
	var path []string
	bad := false
	flush := func() {
		if cur == "" {
			return
		}
		inv.Checked++
		if bad {
			inv.violate("nonce %s: illegal path %s", cur, strings.Join(path, " → "))
		}
	}
	err := lg.EachTransition(ctx, func(nonce string, state tracing.State) error {
		if nonce != cur {
			flush()
			cur, prev, path, bad = nonce, "", path[:0], false
		}
		if len(path) < 64 {
			path = append(path, string(state))
		}
		if !tracing.CanTransition(prev, state) {
			bad = true
		}
		prev = state
		return nil
	})
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	flush()
	return nil
}

// checkRebuild snapshots the projections, rebuilds them from the log and
// compares row for row.
func checkRebuild(ctx context.Context, lg *tracing.Log, inv *Invariant) error {
	before, err := lg.Snapshot(ctx)
	if err != nil {
		return err
	}
	if _, err := lg.Rebuild(ctx); err != nil {
		return fmt.Errorf("chaos: rebuild: %w", err)
	}
	after, err := lg.Snapshot(ctx)
	if err != nil {
		return err
	}
	for _, t := range tracing.ProjectionTables {
		bm, am := before[t], after[t]
		for k, v := range bm {
			inv.Checked++
			if w, ok := am[k]; !ok {
				inv.violate("%s row %s is gone after the rebuild", t, k)
			} else if w != v {
				inv.violate("%s row %s differs: live %s, rebuilt %s", t, k, v, w)
			}
		}
		for k := range am {
			if _, ok := bm[k]; !ok {
				inv.violate("%s row %s appears only after the rebuild", t, k)
			}
		}
	}
	return nil
}
