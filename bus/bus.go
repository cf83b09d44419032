package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// Defaults of Config.
const (
	defaultMaxAttempts     = 5
	defaultJitter          = 0.15
	defaultDeliveryTimeout = 30 * time.Second
	defaultTickInterval    = time.Second
	defaultLease           = 60 * time.Second
	defaultMaxLease        = time.Hour
	defaultMaxBodyBytes    = 64 << 10
	defaultSendWait        = 2 * time.Second
	defaultBatch           = 100
	// defaultPerRecipient bounds the WebSocket attempts in flight to one
	// recipient, so a backlog never overflows its session's send queue.
	defaultPerRecipient = 32
)

// defaultSchedule is the retry delay after the 1st, 2nd, 3rd and 4th failed
// attempt (the reference's 30/60/120/240 s); the last delay repeats when
// MaxAttempts is larger.
var defaultSchedule = []time.Duration{30 * time.Second, 60 * time.Second, 120 * time.Second, 240 * time.Second}

// minDelay is the shortest retry delay the jitter may produce.
const minDelay = 5 * time.Second

// appendTimeout bounds one log write made by the bus.
const appendTimeout = 30 * time.Second

// Config configures a Bus. Log, Directory and Registry are required.
type Config struct {
	Log       *tracing.Log
	Directory *directory.Directory
	Registry  *registry.Registry
	// Clock is the time source of schedules, leases and timestamps;
	// default time.Now. Tests drive it and call Tick.
	Clock func() time.Time
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the bus metrics; nil means none.
	Registerer prometheus.Registerer
	// BusAPIKey (BEAM_BUS_API_KEY) is the operator bus key: a trusted
	// back-end presenting it as "Authorization: Bearer <key>" may send for
	// any local agent, poll, ack and requeue. Empty disables it.
	BusAPIKey string
	// OperatorAuth recognises operator requests (the directory's operator
	// token); operators have the bus key's rights. May be nil.
	OperatorAuth func(*http.Request) bool
	// AllowSender, when set, is asked once per authenticated send with the
	// sending agent: false refuses the send with 429 RATE_LIMITED and a
	// Retry-After of the duration.
	AllowSender func(beamID string) (bool, time.Duration)

	// Schedule is the delay after each failed attempt (defaultSchedule);
	// the last entry repeats.
	Schedule []time.Duration
	// MaxAttempts is how many delivery attempts a message gets before it is
	// dead-lettered (5).
	MaxAttempts int
	// Jitter is the ± fraction applied to each delay (0.15), deterministic
	// per nonce and attempt. Negative means none.
	Jitter float64
	// DeliveryTimeout is how long a WebSocket attempt waits for the
	// recipient's result (30 s).
	DeliveryTimeout time.Duration
	// TickInterval is how often Start runs Tick (1 s).
	TickInterval time.Duration
	// defaultLease and MaxLease bound poll leases (60 s, 1 h).
	DefaultLease, MaxLease time.Duration
	// MaxBodyBytes bounds request bodies (64 KiB).
	MaxBodyBytes int
	// SendWait is how long POST /v1/beam/send waits for an attempt it
	// started to be delivered before answering (2 s).
	SendWait time.Duration
	// Batch is the most messages one Tick step handles (100).
	Batch int
	// PerRecipient bounds the WebSocket attempts in flight per recipient
	// (32).
	PerRecipient int
	// Remote, when set, forwards messages to agents of pinned peer
	// directories (the federation node), which calls RemoteOutcome when the
	// peer's outcome of a forwarded message is committed.
	Remote Remote
}

// Bus is the durable message bus. It is safe for concurrent use.
type Bus struct {
	cfg   Config
	log   *tracing.Log
	dir   *directory.Directory
	reg   *registry.Registry
	clock func() time.Time
	lg    *slog.Logger
	m     *metrics

	// backoff is the wait after a failed attempt (Schedule, Jitter).
	backoff attempt.Backoff
	// keys serializes the bus's state changes of one nonce.
	keys attempt.Keyed
	// loop runs Tick every TickInterval.
	loop attempt.Loop

	mu        sync.Mutex
	active    map[string]int                  // recipient → WebSocket attempts in flight
	draining  map[string]bool                 // recipient → a drain runs (value: run again)
	waiters   map[string][]chan tracing.State // nonce → POST /send handlers waiting
	recovered attempt.Due[string]             // delivered at restart, awaiting a result, by deadline
	// flights mirrors the WebSocket attempts in flight in this process:
	// nonce → the attempt and its message as dispatched. Every other state
	// change of the nonce by the bus drops the entry, so an outcome that
	// finds its entry knows the log still has its attempt current.
	flights map[string]flight
	// queuedFor marks recipients that may have queued messages waiting for
	// a free attempt slot or due now: only for them does a finished attempt
	// look for more work (a session's connect always does).
	queuedFor map[string]bool
	closed    bool

	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New returns a Bus and installs its hooks in the directory. Call Recover
// before serving and Start after it.
func New(cfg Config) (*Bus, error) {
	if cfg.Log == nil || cfg.Directory == nil || cfg.Registry == nil {
		return nil, errors.New("bus: new: log, directory and registry are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Schedule) == 0 {
		cfg.Schedule = defaultSchedule
	}
	for _, d := range cfg.Schedule {
		if d <= 0 {
			return nil, fmt.Errorf("bus: new: retry delay %s must be positive", d)
		}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = defaultMaxAttempts
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = defaultJitter
	}
	if cfg.Jitter < 0 {
		cfg.Jitter = 0
	}
	if cfg.Jitter > 0.5 {
		return nil, fmt.Errorf("bus: new: jitter %v must be at most 0.5", cfg.Jitter)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.DeliveryTimeout, defaultDeliveryTimeout)
	def(&cfg.TickInterval, defaultTickInterval)
	def(&cfg.DefaultLease, defaultLease)
	def(&cfg.MaxLease, defaultMaxLease)
	def(&cfg.SendWait, defaultSendWait)
	if cfg.MaxLease < cfg.DefaultLease {
		cfg.MaxLease = cfg.DefaultLease
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	if cfg.Batch <= 0 {
		cfg.Batch = defaultBatch
	}
	if cfg.PerRecipient <= 0 {
		cfg.PerRecipient = defaultPerRecipient
	}
	b := &Bus{
		cfg: cfg, log: cfg.Log, dir: cfg.Directory, reg: cfg.Registry, clock: cfg.Clock,
		lg:        cfg.Logger.With("component", "bus"),
		active:    map[string]int{},
		draining:  map[string]bool{},
		waiters:   map[string][]chan tracing.State{},
		flights:   map[string]flight{},
		queuedFor: map[string]bool{},
		backoff:   retryBackoff(cfg.Schedule, cfg.Jitter),
	}
	b.loop.Interval, b.loop.Tick, b.loop.Logger, b.loop.Name = cfg.TickInterval, b.Tick, b.lg, "bus"
	m, err := newMetrics(cfg.Registerer, b)
	if err != nil {
		return nil, fmt.Errorf("bus: new: %w", err)
	}
	b.m = m
	return b, nil
}

// Start runs Tick every TickInterval until ctx ends or Close.
func (b *Bus) Start(ctx context.Context) { b.loop.Start(ctx) }

// Close stops the worker. Attempts in flight stay as the log has them;
// the next start's Recover settles them. It does not close the log or the
// directory.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		b.loop.Close()
		b.wg.Wait()
	})
	return nil
}

func (b *Bus) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// flight is a WebSocket attempt in flight: its number and its message as
// the log had it when the attempt was dispatched.
type flight struct {
	n   int
	row tracing.MessageRow
}

// setFlight records attempt n of row as in flight. The caller holds the
// nonce's lock.
func (b *Bus) setFlight(row tracing.MessageRow, n int) {
	b.mu.Lock()
	b.flights[row.Nonce] = flight{n: n, row: row}
	b.mu.Unlock()
}

// takeFlight removes and returns attempt n of nonce; false when another
// state change of the nonce came first. The caller holds the nonce's lock.
func (b *Bus) takeFlight(nonce string, n int) (flight, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, ok := b.flights[nonce]
	if !ok || f.n != n {
		return flight{}, false
	}
	delete(b.flights, nonce)
	return f, true
}

func (b *Bus) dropFlight(nonce string) {
	b.mu.Lock()
	delete(b.flights, nonce)
	b.mu.Unlock()
}

// append writes events durably in one call; the caller's context is not
// used so that a write handed to the log is never abandoned halfway. The
// caller holds the nonce's lock: an attempt of the nonce still in flight is
// no longer current.
func (b *Bus) append(events ...tracing.Event) error {
	_, err := b.appendEvents(events...)
	return err
}

// appendEvents is append returning the committed events.
func (b *Bus) appendEvents(events ...tracing.Event) ([]tracing.Event, error) {
	b.dropFlight(events[0].Nonce)
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	out, err := b.log.Append(ctx, events...)
	if err != nil {
		return nil, fmt.Errorf("record %s of %s: %w", events[len(events)-1].State, events[0].Nonce, err)
	}
	for _, ev := range events {
		if ev.State == tracing.Queued {
			b.markQueued(ev.To)
			break
		}
	}
	b.signal(events[0].Nonce, events[len(events)-1].State)
	return out, nil
}

// markQueued notes that recipient may have queued messages.
func (b *Bus) markQueued(recipient string) {
	b.mu.Lock()
	b.queuedFor[recipient] = true
	b.mu.Unlock()
}

// signal wakes the send handlers waiting on nonce with its new state.
func (b *Bus) signal(nonce string, state tracing.State) {
	b.mu.Lock()
	ws := b.waiters[nonce]
	delete(b.waiters, nonce)
	b.mu.Unlock()
	for _, ch := range ws {
		ch <- state
	}
}

// waitFor returns a channel that receives the nonce's state at its next
// state change.
func (b *Bus) waitFor(nonce string) <-chan tracing.State {
	ch := make(chan tracing.State, 1)
	b.mu.Lock()
	b.waiters[nonce] = append(b.waiters[nonce], ch)
	b.mu.Unlock()
	return ch
}

// dropWaiter removes ch from nonce's waiters; the others stay.
func (b *Bus) dropWaiter(nonce string, ch <-chan tracing.State) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ws := b.waiters[nonce]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(b.waiters, nonce)
		return
	}
	b.waiters[nonce] = ws
}

func (b *Bus) dropWaiters(nonce string) {
	b.mu.Lock()
	delete(b.waiters, nonce)
	b.mu.Unlock()
}

// nowMs is the clock in unix milliseconds.
func (b *Bus) nowMs() int64 { return b.clock().UnixMilli() }

// secs converts a time to the epoch seconds of tracing.MessageRow's times.
func secs(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

// event returns an event of row's message.
func event(row tracing.MessageRow, state tracing.State, transport string, attempt int) tracing.Event {
	return tracing.Event{Nonce: row.Nonce, State: state, From: row.Sender, To: row.Recipient,
		IntentType: row.Intent, Transport: transport, Attempt: attempt}
}

// Transports of the bus's events.
const (
	transportBus  = "bus"
	transportWS   = "ws"
	transportPoll = "poll"
)

// notifySender tells a connected sender how its message ended:
// {"type":"result","frame":…,"bus":{"messageId","nonce","status"}}.
func (b *Bus) notifySender(row tracing.MessageRow, status tracing.State, frame []byte) {
	if len(frame) == 0 {
		return
	}
	mark, err := json.Marshal(map[string]string{"messageId": row.ID, "nonce": row.Nonce, "status": string(status)})
	if err != nil {
		return
	}
	msg := make([]byte, 0, len(frame)+len(mark)+40)
	msg = append(msg, `{"type":"result","frame":`...)
	msg = append(msg, frame...)
	msg = append(msg, `,"bus":`...)
	msg = append(msg, mark...)
	msg = append(msg, '}')
	b.dir.NotifyAgent(row.Sender, msg)
}

// successResult builds the unsigned success result frame the bus records
// for an acked message (payload: the consumer's response, or {}).
func successResult(nonce string, payload json.RawMessage, now time.Time, lat *int64) []byte {
	if len(payload) == 0 || payload[0] != '{' {
		payload = json.RawMessage("{}")
	}
	raw, err := wire.Result{Success: true, Nonce: nonce, Payload: payload, Latency: lat}.Build(now, nil)
	if err != nil {
		return wire.FailureResult(nonce, "RESULT_ERROR", "result could not be built", now, lat)
	}
	return raw
}
