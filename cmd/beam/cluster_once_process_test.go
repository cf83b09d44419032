package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// onceRecipient counts the deliveries of each nonce it receives. The first
// delivery of a "task.hold" intent is announced on entered and answered
// only when release is signalled; while a load gate is set, "task.load"
// intents wait for it to close.
type onceRecipient struct {
	mu      sync.Mutex
	seen    map[string]int
	gate    chan struct{}
	held    int
	entered chan string
	release chan struct{}
}

func newOnceRecipient() *onceRecipient {
	return &onceRecipient{seen: map[string]int{}, entered: make(chan string, 1), release: make(chan struct{}, 1)}
}

func (r *onceRecipient) handle(ctx context.Context, in *agents.Intent) agents.Reply {
	r.mu.Lock()
	r.seen[in.Nonce]++
	first := r.seen[in.Nonce] == 1
	gate := r.gate
	if in.Type == "task.load" && gate != nil {
		r.held++
	}
	r.mu.Unlock()
	if in.Type == "task.load" && gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	if in.Type == "task.hold" && first {
		r.entered <- in.Nonce
		select {
		case <-r.release:
		case <-ctx.Done():
		}
	}
	return agents.Success(map[string]any{"ok": true})
}

// holdLoad makes "task.load" intents wait until the returned gate closes.
func (r *onceRecipient) holdLoad() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gate = make(chan struct{})
	return r.gate
}

// heldLoad counts the "task.load" intents that waited for a gate.
func (r *onceRecipient) heldLoad() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

// openLoad closes the gate: waiting intents are answered, later ones at
// once.
func (r *onceRecipient) openLoad() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.gate)
	r.gate = nil
}

func (r *onceRecipient) count(nonce string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[nonce]
}

// runLoad calls step(0), step(1), … in a goroutine until the returned
// function is called; that function returns once the step running ended.
func runLoad(step func(k int)) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for k := 0; ; k++ {
			select {
			case <-quit:
				return
			default:
			}
			step(k)
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// TestClusterBusOnceProcesses: three nodes over a three-server embedded
// NATS cluster; a durable message the recipient acknowledged is never
// delivered to it again, whichever node dies.
//
// The holder dies: durable messages from two nodes flow to an agent on a
// third, which is SIGKILLed under load with frames the agent has not
// answered yet; the agent reconnects elsewhere.
// Every acknowledged message ends acked on its owner and reached the agent;
// every one whose acknowledgement the dead holder had recorded (acked in its
// log) reached it exactly once — the owners learn it from the cluster's
// delivery record instead of delivering again.
//
// The owner dies: the recipient acknowledges a message through its holder
// after the message's owner was SIGKILLed, and then reconnects to another
// node; the owner's restart recovery requeues the message and settles it
// from the delivery record (acked, transport cluster) without a second
// delivery.
func TestClusterBusOnceProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	nodes := beamtest.StartAll(t, clusterOptions(t, 3, withoutTakeover("--bus-retry-schedule", "200ms,500ms,1s",
		"--bus-max-attempts", "500", "--bus-delivery-timeout", "20s", "--bus-tick-interval", "100ms")...)...)

	r := newOnceRecipient()
	rcpt := &clusterAgent{}
	rcpt.id, _ = sdkAgent(t, ctx, nodes[1].URL(), "rcpt@"+clusterDomain)
	rcpt.connect(t, ctx, nodes[1].URL(), 1, r.handle)
	senders := map[int]*agents.Client{}
	for _, i := range []int{0, 2} {
		_, senders[i] = sdkAgent(t, ctx, nodes[i].URL(), fmt.Sprintf("sender%d@%s", i, clusterDomain))
		// The sender's node knows where the recipient's session is.
		require.Eventually(t, func() bool {
			res, err := senders[i].Send(ctx, rcpt.id.BeamID, "task.warm", nil)
			return err == nil && res.Success
		}, 30*time.Second, 50*time.Millisecond, "node %d routes to node 1", i)
	}

	// The holder (node 1) dies under load.
	var (
		lmu  sync.Mutex
		sent []durableSent
	)
	countSent := func() int {
		lmu.Lock()
		defer lmu.Unlock()
		return len(sent)
	}
	stopLoad := runLoad(func(k int) {
		owner := []int{0, 2}[k%2]
		rec, err := senders[owner].SendDurable(ctx, rcpt.id.BeamID, "task.load", map[string]any{"k": k}, nil)
		if err == nil {
			lmu.Lock()
			sent = append(sent, durableSent{nonce: rec.Nonce, owner: owner})
			lmu.Unlock()
		}
	})
	require.Eventually(t, func() bool { return countSent() >= 40 }, 2*time.Minute, 20*time.Millisecond)
	// Some frames are with the recipient, unanswered, when the holder dies;
	// their answers die with it.
	r.holdLoad()
	require.Eventually(t, func() bool { return r.heldLoad() >= 3 }, time.Minute, 20*time.Millisecond)
	nodes[1].Kill()
	r.openLoad()
	rcpt.connect(t, ctx, nodes[2].URL(), 2, r.handle)
	before := countSent()
	require.Eventually(t, func() bool { return countSent() >= before+20 }, 2*time.Minute, 20*time.Millisecond,
		"durable sends continue after the holder died")
	stopLoad()
	lmu.Lock()
	all := slices.Clone(sent)
	lmu.Unlock()
	var ackedAtHolder []string
	for _, m := range all {
		if st, err := queryState(t, nodes[1].DataDir, m.nonce); err == nil && st == tracing.Acked {
			ackedAtHolder = append(ackedAtHolder, m.nonce)
		}
	}
	waitClusterAcked(t, nodes, all, 3*time.Minute)
	twice, fromRecord := 0, 0
	for _, m := range all {
		require.GreaterOrEqual(t, r.count(m.nonce), 1, "message %s was never delivered", m.nonce)
		if r.count(m.nonce) > 1 {
			twice++
		}
		if slices.Contains(traceTransports(t, nodes[m.owner].DataDir, m.nonce), "acked/cluster") {
			fromRecord++
		}
	}
	for _, nonce := range ackedAtHolder {
		require.Equal(t, 1, r.count(nonce), "message %s was acknowledged at the dead holder and delivered again", nonce)
	}
	t.Logf("holder killed: %d durable messages, %d acknowledged at the holder, %d settled from the delivery record, "+
		"%d delivered twice (their acknowledgement died with the holder)", len(all), len(ackedAtHolder), fromRecord, twice)

	// The owner (node 0) dies after handing a message to the holder (node
	// 2); the recipient acknowledges it while the owner is down.
	nodes[1].Restart()
	require.Eventually(t, func() bool {
		res, err := senders[0].Send(ctx, rcpt.id.BeamID, "task.warm", nil)
		return err == nil && res.Success
	}, 30*time.Second, 50*time.Millisecond, "node 0 routes to node 2")
	rec, err := senders[0].SendDurable(ctx, rcpt.id.BeamID, "task.hold", nil, nil)
	require.NoError(t, err)
	select {
	case nonce := <-r.entered:
		require.Equal(t, rec.Nonce, nonce)
	case <-ctx.Done():
		require.FailNow(t, "the held message never reached the recipient")
	}
	nodes[0].Kill()
	r.release <- struct{}{}
	require.Eventually(t, func() bool {
		st, err := queryState(t, nodes[2].DataDir, rec.Nonce)
		return err == nil && st == tracing.Acked
	}, time.Minute, 20*time.Millisecond, "the holder records the recipient's acknowledgement")
	// The recipient moves on before the owner is back: the node it is on
	// now has never seen the message.
	rcpt.connect(t, ctx, nodes[1].URL(), 1, r.handle)
	nodes[0].Restart()
	waitClusterAcked(t, nodes, []durableSent{{nonce: rec.Nonce, owner: 0}}, 2*time.Minute)
	require.Equal(t, 1, r.count(rec.Nonce), "the owner delivered an acknowledged message again after its restart")
	trace := traceTransports(t, nodes[0].DataDir, rec.Nonce)
	require.Equal(t, "acked/cluster", trace[len(trace)-1], "%v", trace)
}
