package federation

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// The node is the bus's router to peer directories.
var _ bus.Remote = (*Node)(nil)

// busFront is a directory's message bus forwarding through its node, served
// with the registry and relay routes.
type busFront struct {
	bus  *bus.Bus
	prom *prometheus.Registry
	url  string
}

// testBusKey is the operator bus key of startBus's buses.
const testBusKey = "test-bus-key"

func startBus(t *testing.T, d *fedDir) *busFront {
	t.Helper()
	prom := prometheus.NewRegistry()
	b, err := bus.New(bus.Config{Log: d.log, Directory: d.dir, Registry: d.reg, Registerer: prom, BusAPIKey: testBusKey,
		Remote: d.node, TickInterval: 20 * time.Millisecond, DeliveryTimeout: 10 * time.Second})
	require.NoError(t, err)
	d.owners.bus.Store(b)
	_, err = b.Recover(context.Background())
	require.NoError(t, err)
	b.Start(context.Background())
	t.Cleanup(func() { _ = b.Close() })
	mux := http.NewServeMux()
	d.reg.Routes(mux)
	d.dir.Routes(mux)
	b.Routes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &busFront{bus: b, prom: prom, url: srv.URL}
}

func (f *busFront) outcomes(t *testing.T, outcome string) float64 {
	t.Helper()
	mfs, err := f.prom.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "beam_bus_outcomes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waitMessage waits until the bus message of nonce is in state st.
func (d *fedDir) waitMessage(nonce string, st tracing.State) {
	d.t.Helper()
	require.Eventually(d.t, func() bool {
		m, ok, err := d.log.Message(context.Background(), nonce)
		return err == nil && ok && m.Status == st
	}, 30*time.Second, 20*time.Millisecond, "message %s never became %s", nonce, st)
}

func sdkAt(t *testing.T, url, beamID string) *agents.Client {
	t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: id,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Register(context.Background(), beamID, []string{"test"})
	require.NoError(t, err)
	return c
}

func TestBusForwardsDurableSendsToPeers(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var mu sync.Mutex
	seen := map[string]int{}
	b := beta.agent("b")
	b.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		seen[in.Nonce]++
		mu.Unlock()
		if in.Type == "task.refuse" {
			return agents.Failure("NOPE", "b refuses")
		}
		return agents.Success(map[string]any{"ok": true})
	})
	require.NoError(t, b.Connect(ctx))
	a := sdkAt(t, front.url, "a@alpha.beam.directory")

	// A signed durable send crosses and ends acked at the origin, with the
	// federation transport and the peer in the trace.
	rec, err := a.SendDurable(ctx, "b@beta.beam.directory", "task.run", map[string]any{"n": 1}, nil)
	require.NoError(t, err)
	alpha.waitMessage(rec.Nonce, tracing.Acked)
	tr := alpha.trace(rec.Nonce)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Dispatched, tracing.Delivered, tracing.Acked}, lifecycle(tr))
	requireOutboxSteps(t, tr, Published)
	require.Equal(t, "federation", tr[1].Transport)
	require.Equal(t, "beta.beam.directory", tr[1].Details.Extra["peer"])
	require.Eventually(t, func() bool { return front.outcomes(t, "acked") == 1 }, 10*time.Second, 10*time.Millisecond,
		"the bus counts the peer's outcome")
	st, err := a.DurableMessageStatus(ctx, rec.MessageID)
	require.NoError(t, err)
	require.Equal(t, "acked", st.Status)

	// The recipient's failure is the message's outcome (failed), once.
	rec2, err := a.SendDurable(ctx, "b@beta.beam.directory", "task.refuse", map[string]any{}, nil)
	require.NoError(t, err)
	alpha.waitMessage(rec2.Nonce, tracing.Failed)
	require.Eventually(t, func() bool { return front.outcomes(t, "failed") == 1 }, 10*time.Second, 10*time.Millisecond)

	// An API-key send to a peer's agent is forwarded, vouched for by alpha.
	status, body := busSend(t, ctx, front.url, "x-api-key", a.APIKey(),
		`{"from":"a@alpha.beam.directory","to":"b@beta.beam.directory","intent":"task.run"}`)
	require.Equal(t, http.StatusCreated, status, body)
	rec3 := decodeSend(t, body)
	alpha.waitMessage(rec3.Nonce, tracing.Acked)

	// A domain no peer serves is still an unknown recipient.
	_, err = a.SendDurable(ctx, "x@gamma.beam.directory", "task.run", map[string]any{}, nil)
	require.ErrorContains(t, err, "UNKNOWN_AGENT")

	mu.Lock()
	require.Equal(t, map[string]int{rec.Nonce: 1, rec2.Nonce: 1, rec3.Nonce: 1}, seen)
	mu.Unlock()
}

func TestBusForwardedMessageDeadLettersWhenPeerIsUnpinned(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = beta.agent("b") // registered, never connected
	a := sdkAt(t, front.url, "a@alpha.beam.directory")
	beta.stop()

	rec, err := a.SendDurable(ctx, "b@beta.beam.directory", "task.run", map[string]any{}, nil)
	require.NoError(t, err)
	require.Equal(t, "dispatched", rec.Status, "handed to the outbox without waiting for the peer")

	// A restart of the bus leaves the outbox's attempt alone.
	rep, err := front.bus.Recover(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.Requeued)
	m, ok, err := alpha.log.Message(ctx, rec.Nonce)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tracing.Dispatched, m.Status)

	_, err = alpha.node.RemovePeer(ctx, "beta.beam.directory")
	require.NoError(t, err)
	alpha.waitMessage(rec.Nonce, tracing.DeadLetter)
	require.Eventually(t, func() bool { return front.outcomes(t, "dead_letter") == 1 }, 10*time.Second, 10*time.Millisecond)
}

// A durable send reaches a peer whose clock is past the frame's replay
// window (as after an outage longer than five minutes): the peer checks the
// window against the instant the origin admitted the frame, which the
// origin's signature vouches for, and delivers it once.
func TestBusForwardedFrameOutlivesReplayWindow(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	later := func(c *directory.Config) {
		c.Clock = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	}
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil, later)
	pin(t, alpha, beta)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var delivered atomic.Int64
	b := beta.agent("b")
	b.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		delivered.Add(1)
		return agents.Success(map[string]any{"ok": true})
	})
	require.NoError(t, b.Connect(ctx))
	a := sdkAt(t, front.url, "a@alpha.beam.directory")
	skew.Store(int64(directory.ReplayWindow + 5*time.Minute))

	rec, err := a.SendDurable(ctx, "b@beta.beam.directory", "task.run", map[string]any{"n": 1}, nil)
	require.NoError(t, err)
	alpha.waitMessage(rec.Nonce, tracing.Acked)
	require.EqualValues(t, 1, delivered.Load())
	tr := beta.trace(rec.Nonce)
	require.NotEmpty(t, tr)
	require.Contains(t, tr[0].Details.Extra, "admittedAt", "the target records the vouched admission instant")

	// A sync (directory-owned) frame gets no such allowance: the same
	// stale timestamp is refused by the peer.
	aws := alpha.agent("a2")
	_, err = aws.Send(ctx, "b@beta.beam.directory", "task.run", map[string]any{"n": 2})
	require.ErrorContains(t, err, "replay window")
	require.EqualValues(t, 1, delivered.Load())
}

// busOwners is the directory's SessionOwner in these tests: the bus that
// startBus may start after the directory serves.
type busOwners struct{ bus atomic.Pointer[bus.Bus] }

func (o *busOwners) Connected(beamID string) {
	if b := o.bus.Load(); b != nil {
		b.AgentConnected(beamID)
	}
}

func (o *busOwners) LateResult(beamID string, rf *wire.ResultFrame) bool {
	b := o.bus.Load()
	return b != nil && b.LateResult(beamID, rf)
}

// remoteOutcome is the node's Config.BusOutcome: the bus's, once started.
func (o *busOwners) remoteOutcome(nonce string) {
	if b := o.bus.Load(); b != nil {
		b.RemoteOutcome(nonce)
	}
}
