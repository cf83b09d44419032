package mesh

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// intentEnvelope is the intent type of a hop delivered to an actor; the
// frame's payload is the whole envelope.
const intentEnvelope = wire.MeshIntent

// Defaults of Config.
const (
	DefaultMaxPayloadBytes = 48 << 10
	defaultTimeout         = 5 * time.Minute
	defaultMaxTimeout      = 24 * time.Hour
	defaultHopTimeout      = 30 * time.Second
	defaultTickInterval    = 100 * time.Millisecond
	// offlineWait is how long a hop whose hand-off to an actor that just
	// left failed waits before the next look (no attempt is counted). A
	// hop whose actor is offline waits for it to connect instead
	// (waitOffline).
	offlineWait = time.Second
)

// Config configures New.
type Config struct {
	Log       *tracing.Log
	Directory *directory.Directory
	Registry  *registry.Registry
	// Clock is the time source of deadlines, retries and timestamps.
	Clock func() time.Time
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
	// OperatorAuth recognises operator requests; may be nil.
	OperatorAuth func(*http.Request) bool
	// Policies are the per-actor retry policies; Default applies to the
	// others (defaultPolicy when zero).
	Policies map[string]Policy
	Default  Policy
	// MaxHops bounds the hops of an envelope (defaultMaxHops).
	MaxHops int
	// MaxPayloadBytes bounds a payload (DefaultMaxPayloadBytes), so that
	// an envelope fits one WebSocket message either way.
	MaxPayloadBytes int
	// defaultTimeout is the deadline of an envelope created without one;
	// MaxTimeout the longest accepted.
	DefaultTimeout, MaxTimeout time.Duration
	// HopTimeout is how long one hop attempt waits for the actor.
	HopTimeout time.Duration
	// TickInterval is how often due retries and deadlines are checked.
	TickInterval time.Duration
	// AllowCreate, when set, rate-limits the envelopes an agent creates:
	// it reports whether creator may create one now, or how long to wait.
	AllowCreate func(creator string) (bool, time.Duration)
	// MaxOpenPerCreator caps an agent's open envelopes (fan-out children
	// included) when it creates one; 0 means no cap.
	MaxOpenPerCreator int
}

// Engine routes envelopes through actors. It is safe for concurrent use.
type Engine struct {
	cfg  Config
	log  *tracing.Log
	dir  *directory.Directory
	reg  *registry.Registry
	lg   *slog.Logger
	m    *metrics
	hub  *hub
	seed maphash.Seed

	// locks serializes the steps of one envelope (lock).
	locks attempt.Keyed
	// creates serializes the open-envelope check and creation of one
	// creator's envelopes (checkCreate).
	creates attempt.Keyed
	// loop runs Tick every TickInterval; its Stopping ends the hop
	// workers' waits at Close.
	loop attempt.Loop

	mu      sync.Mutex
	closed  bool
	running map[string]bool // ids with an attempt being started; true: start it again after
	// offline are the envelopes waiting for an offline actor, by actor:
	// its connecting wakes them (actorConnected).
	offline map[string]map[string]struct{}
	wg      sync.WaitGroup
	stop    <-chan struct{}
	warm    chan func()   // hop workers waiting for more work (goWarm)
	idle    time.Duration // how long a hop worker waits for work
}

// New checks cfg and builds an engine. Call Recover, then Start.
func New(cfg Config) (*Engine, error) {
	if cfg.Log == nil || cfg.Directory == nil || cfg.Registry == nil {
		return nil, errors.New("mesh: new: log, directory and registry are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Default.MaxAttempts == 0 {
		cfg.Default = defaultPolicy
	}
	if err := cfg.Default.Validate(); err != nil {
		return nil, fmt.Errorf("mesh: default policy: %w", err)
	}
	for a, p := range cfg.Policies {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("mesh: policy of %s: %w", a, err)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.DefaultTimeout, defaultTimeout)
	def(&cfg.MaxTimeout, defaultMaxTimeout)
	def(&cfg.HopTimeout, defaultHopTimeout)
	def(&cfg.TickInterval, defaultTickInterval)
	if cfg.MaxHops <= 0 {
		cfg.MaxHops = defaultMaxHops
	}
	if cfg.MaxPayloadBytes <= 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	m := newMetrics(cfg.Registerer)
	e := &Engine{
		cfg: cfg, log: cfg.Log, dir: cfg.Directory, reg: cfg.Registry, lg: cfg.Logger.With("component", "mesh"),
		m: m, hub: newHub(m), seed: maphash.MakeSeed(), running: map[string]bool{},
		offline: map[string]map[string]struct{}{},
		warm:    make(chan func()), idle: warmIdle,
	}
	e.loop = attempt.Loop{Interval: cfg.TickInterval, Logger: e.lg, Name: "mesh", Tick: func(ctx context.Context) error {
		if err := e.Tick(ctx); err != nil && !e.isClosed() {
			return err
		}
		return nil
	}}
	e.stop = e.loop.Stopping()
	return e, nil
}

// lock serializes the steps of one envelope.
func (e *Engine) lock(id string) func() { return e.locks.Lock(id) }

// Start runs the scheduler until Close.
func (e *Engine) Start(ctx context.Context) { e.loop.Start(ctx) }

// Close stops the scheduler and waits for it; attempts in flight keep their
// state in the log and Recover resumes them after a restart.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.loop.Close()
	e.hub.closeAll()
	e.wg.Wait()
	return nil
}

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Tick fails envelopes past their deadline and starts the due hops.
func (e *Engine) Tick(ctx context.Context) error {
	now := e.cfg.Clock()
	expired, err := e.log.MeshExpired(ctx, now.UnixMilli(), 256)
	if err != nil {
		return err
	}
	for _, id := range expired {
		if err := e.expire(ctx, id); err != nil {
			e.lg.Warn("mesh deadline", "id", id, "err", err)
		}
	}
	due, err := e.log.MeshOpen(ctx, true, now.UnixMilli(), 512)
	if err != nil {
		return err
	}
	for _, row := range due {
		e.startAttempt(row.ID)
	}
	return nil
}

// startAttempt runs attempt for id in its own goroutine; when one is
// already starting, that one runs attempt once more after (a wake that
// came while it looked must not be lost).
func (e *Engine) startAttempt(id string) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	if _, ok := e.running[id]; ok {
		e.running[id] = true
		e.mu.Unlock()
		return
	}
	e.running[id] = false
	e.wg.Add(1)
	e.mu.Unlock()
	e.goWarm(func() {
		defer e.wg.Done()
		for {
			if err := e.attempt(context.Background(), id); err != nil && !e.isClosed() {
				e.lg.Warn("mesh attempt", "id", id, "err", err)
			}
			e.mu.Lock()
			again := e.running[id] && !e.closed
			if again {
				e.running[id] = false
			} else {
				delete(e.running, id)
			}
			e.mu.Unlock()
			if !again {
				return
			}
		}
	})
}

// waitOffline marks envelope id as waiting for actor and reports whether
// it was marked already (its wait is recorded).
func (e *Engine) waitOffline(id, actor string) (already bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	set := e.offline[actor]
	if set == nil {
		set = map[string]struct{}{}
		e.offline[actor] = set
	}
	_, already = set[id]
	set[id] = struct{}{}
	return already
}

// stopWaiting unmarks envelope id (its hop goes ahead, or it ended).
func (e *Engine) stopWaiting(id, actor string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if set := e.offline[actor]; set != nil {
		delete(set, id)
		if len(set) == 0 {
			delete(e.offline, actor)
		}
	}
}

// woken reports whether envelope id waits for actor, which is online now.
func (e *Engine) woken(id, actor string) bool {
	e.mu.Lock()
	_, waiting := e.offline[actor][id]
	e.mu.Unlock()
	return waiting && e.dir.Online(actor)
}

// ActorConnected starts the hops waiting for beamID, which attached a
// session here or on another node of the cluster (the assembly calls it
// from the directory's directory.SessionOwner).
func (e *Engine) ActorConnected(beamID string) {
	e.mu.Lock()
	ids := make([]string, 0, len(e.offline[beamID]))
	for id := range e.offline[beamID] {
		ids = append(ids, id)
	}
	e.mu.Unlock()
	for _, id := range ids {
		e.startAttempt(id)
	}
}

// warmIdle is how long a hop worker waits for more work before it exits.
const warmIdle = time.Second

// goWarm runs f on its own goroutine: on a hop worker that finished earlier
// work and is waiting for more when there is one, on a new one otherwise.
// Each hop runs its attempt, its delivery and its outcome on such
// goroutines; started fresh for every one, they grew their stacks again
// each time (the attestation's signature, the log append, the encoders).
func (e *Engine) goWarm(f func()) {
	select {
	case e.warm <- f:
	default:
		go e.warmLoop(f)
	}
}

// warmLoop runs f, then whatever goWarm hands it, until it has waited
// e.idle for work or the engine closes.
func (e *Engine) warmLoop(f func()) {
	t := time.NewTimer(e.idle)
	defer t.Stop()
	for {
		f()
		t.Reset(e.idle)
		select {
		case f = <-e.warm:
		case <-t.C:
			return
		case <-e.stop:
			return
		}
	}
}

// Recover resumes every envelope a previous process left in flight: a hop
// that was dispatched or delivered without an outcome is queued again with
// its attempt number reused (an actor of this directory may see it twice; a
// hop to a peer directory is relayed again under the same nonce, which the
// peer deduplicates; the envelope still finishes once). Run it before Start.
func (e *Engine) Recover(ctx context.Context) (int, error) {
	rows, err := e.log.MeshOpen(ctx, false, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("mesh recover: %w", err)
	}
	n := 0
	for _, row := range rows {
		requeued, err := e.resume(ctx, row, nil)
		if err != nil {
			return n, fmt.Errorf("mesh recover %s: %w", row.ID, err)
		}
		if requeued {
			n++
		}
	}
	if n > 0 {
		e.lg.Info("mesh recovery", "requeued", n)
	}
	return n, nil
}

// resume takes up row, an envelope another process left open: one waiting
// for its offline actor waits here (woken when it connects); a hop in
// flight, whose outcome cannot be determined, is queued again as unknown
// until it is dispatched again, and resume reports it requeued. from is
// set when the envelope was taken over from a dead node (Adopt): the
// requeue then has transport takeover and names the node, and any other
// open envelope gets a takeover step that changes nothing else.
func (e *Engine) resume(ctx context.Context, row tracing.MeshRow, from *tracing.Takeover) (bool, error) {
	var marker map[string]any
	if from != nil {
		marker = from.Marker(nil)
	}
	if row.State == tracing.Dispatched || row.State == tracing.Delivered {
		// A wait this engine recorded before is over: the next attempt
		// records its own.
		e.stopWaiting(row.ID, row.Actor)
		transport, reason := "recovery", "interrupted by a restart"
		if from != nil {
			transport, reason = tracing.TransportTakeover, "taken over from a node that stopped"
		}
		ev := e.event(row, tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait, Status: tracing.MeshUnknown,
			Attempt: max(row.Attempt-1, 0), Reason: reason})
		ev.Transport, ev.Details.Extra = transport, marker
		return true, e.append(ctx, []string{row.ID}, ev)
	}
	if row.State == tracing.Queued && row.DeadlineAt > 0 && row.NextAt == row.DeadlineAt && row.Actor != "" {
		// Waiting for its offline actor (attempt): woken when it
		// connects.
		e.waitOffline(row.ID, row.Actor)
	}
	if from == nil {
		return false, nil
	}
	ev := e.event(row, row.State, tracing.MeshStep{Kind: meshKindTakeover, Attempt: row.Attempt,
		FirstAttemptAt: row.FirstAttemptAt, NextAt: row.NextAt})
	ev.Transport, ev.Details.Extra = tracing.TransportTakeover, marker
	return false, e.append(ctx, []string{row.ID}, ev)
}

// event builds an event of row's nonce carrying step.
func (e *Engine) event(row tracing.MeshRow, state tracing.State, step tracing.MeshStep) tracing.Event {
	return tracing.Event{Nonce: row.Nonce, State: state, Transport: "mesh", Attempt: step.Attempt,
		Details: tracing.Details{Mesh: step.Encode()}}
}

// append writes events atomically and notifies subscribers of ids.
func (e *Engine) append(ctx context.Context, ids []string, events ...tracing.Event) error {
	if _, err := e.log.Append(ctx, events...); err != nil {
		return err
	}
	for _, id := range ids {
		e.notify(id)
	}
	return nil
}

// notify publishes the current row of id to its subscribers: only the
// terminal one when the envelope's status reporting is off.
func (e *Engine) notify(id string) {
	e.hub.forget(id)
	if !e.hub.has(id) {
		return
	}
	row, ok, err := e.log.MeshEnvelope(context.Background(), id)
	if err != nil || !ok || (!row.Status.Terminal() && statusOff(row)) {
		return
	}
	e.hub.status(row)
}

// newTraceparent returns a new W3C trace context (version 00, sampled):
// a random trace id and parent id.
func newTraceparent() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("read random: %v", err))
	}
	return fmt.Sprintf("00-%x-%x-01", b[:16], b[16:])
}

// validTraceparent reports whether v is a W3C traceparent this gateway
// keeps: version 00, 32 and 16 lowercase hex digits not all zero, two hex
// flag digits.
func validTraceparent(v string) bool {
	if len(v) != 55 || v[:3] != "00-" || v[35] != '-' || v[52] != '-' {
		return false
	}
	hex := func(s string) bool {
		for _, c := range s {
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
		return strings.Trim(s, "0") != "" || len(s) == 2
	}
	return hex(v[3:35]) && hex(v[36:52]) && hex(v[53:55])
}

// draw returns a deterministic jitter draw in [0,1) for an attempt.
func (e *Engine) draw(id string, attempt int) float64 {
	var h maphash.Hash
	h.SetSeed(e.seed)
	h.WriteString(id)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(attempt))
	h.Write(b[:])
	return float64(h.Sum64()>>11) / float64(1<<53)
}

// policy returns the retry policy of actor.
func (e *Engine) policy(actor string) Policy {
	if p, ok := e.cfg.Policies[actor]; ok {
		return p
	}
	return e.cfg.Default
}

func nonceOf(id string) string { return "mesh:" + id }
