package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

const (
	alphaDomain = "alpha.beam.directory"
	betaDomain  = "beta.beam.directory"
)

// peerActor is the pipeline's middle actor, an agent of the peer
// directory: it enriches the payload and counts its deliveries per
// envelope. The first delivery of an envelope whose payload names a hold
// waits until that hold is released (or the actor's connection ends).
type peerActor struct {
	mu      sync.Mutex
	runs    map[string]int // envelope id -> deliveries
	done    map[string]int // envelope id -> results returned
	holds   map[string]chan struct{}
	reached chan string // envelope ids held
}

func newPeerActor() *peerActor {
	return &peerActor{runs: map[string]int{}, done: map[string]int{}, holds: map[string]chan struct{}{}, reached: make(chan string, 16)}
}

func (a *peerActor) hold(name string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch, ok := a.holds[name]
	if !ok {
		ch = make(chan struct{})
		a.holds[name] = ch
	}
	return ch
}

func (a *peerActor) handle(ctx context.Context, h *agents.MeshHop) (any, error) {
	var in struct {
		Hold string `json:"hold"`
	}
	_ = h.Bind(&in)
	a.mu.Lock()
	a.runs[h.Envelope.ID]++
	first := a.runs[h.Envelope.ID] == 1
	a.mu.Unlock()
	if in.Hold != "" && first {
		gate := a.hold(in.Hold)
		a.reached <- h.Envelope.ID
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out, err := enrichPayload(h, func(m map[string]any) { m["recipe"] = "Cook ice-cream in tomato sauce for 3 hours" })
	a.mu.Lock()
	a.done[h.Envelope.ID]++
	a.mu.Unlock()
	return out, err
}

func (a *peerActor) counts(envID string) (runs, done int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[envID], a.done[envID]
}

// waitReached waits until the actor holds envID.
func (a *peerActor) waitReached(t *testing.T, envID string) {
	t.Helper()
	for {
		select {
		case got := <-a.reached:
			if got == envID {
				return
			}
		case <-time.After(60 * time.Second):
			require.FailNow(t, "the peer's actor was not reached")
		}
	}
}

// meshPeers is two federated beam serve processes: alpha runs the gateway
// and the first and last actors of the route, beta the middle one.
type meshPeers struct {
	*meshStack // the gateway at alpha, with the creator's API key
	fp         fedPair
	recipe     *agents.Identity
	local      map[string]*agents.Identity // alpha's actors
	actor      *peerActor
	route      []string
}

// startMeshPeers starts the pair with hopTimeout per hop and a retry
// policy for the peer's actor, connects the actors and returns the pair.
func startMeshPeers(t *testing.T, hopTimeout string) *meshPeers {
	t.Helper()
	recipeID := "recipe@" + betaDomain
	pol, err := json.Marshal(map[string]any{"actors": map[string]any{
		recipeID: map[string]any{"maxAttempts": 10, "backoff": "constant", "initialDelay": "200ms"},
	}})
	require.NoError(t, err)
	polPath := filepath.Join(t.TempDir(), "policies.json")
	require.NoError(t, os.WriteFile(polPath, pol, 0o600))
	fp := startFedPair(t, true,
		[]string{"--default-policy", "allow", "--mesh-hop-timeout", hopTimeout, "--mesh-policies", polPath},
		[]string{"--default-policy", "allow"})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	s := &meshStack{t: t, p: fp.alpha, ctx: ctx, actors: map[string]string{}}
	s.creator, _ = sdkAgent(t, ctx, fp.alpha.URL(), "client@"+alphaDomain)
	mp := &meshPeers{meshStack: s, fp: fp, actor: newPeerActor(), local: map[string]*agents.Identity{}}
	for _, name := range []string{"loader", "judge"} {
		mp.local[name], _ = sdkAgent(t, ctx, fp.alpha.URL(), name+"@"+alphaDomain)
		s.actors[name] = mp.local[name].BeamID
	}
	mp.connectAlpha()
	mp.recipe, _ = sdkAgent(t, ctx, fp.beta.URL(), recipeID)
	mp.connectRecipe()
	mp.route = []string{s.actors["loader"], recipeID, s.actors["judge"]}
	return mp
}

// connectAlpha connects alpha's actors (again, after a restart).
func (m *meshPeers) connectAlpha() {
	for name, h := range map[string]agents.MeshHandler{
		"loader": enrich(func(p map[string]any) { p["product_name"] = "Ice-cream Bourgignon" }),
		"judge":  enrich(func(p map[string]any) { p["recipe_eval"] = "INVALID" }),
	} {
		c := sdkClient(m.t, m.fp.alpha.URL(), m.local[name])
		c.HandleMesh(h)
		require.NoError(m.t, c.Connect(m.ctx))
	}
}

// connectRecipe connects the peer's actor to beta (again, after a restart).
func (m *meshPeers) connectRecipe() *agents.Client {
	c := sdkClient(m.t, m.fp.beta.URL(), m.recipe)
	c.HandleMesh(m.actor.handle)
	require.NoError(m.t, c.Connect(m.ctx))
	return c
}

// peerNonces are the nonces of the intents that carried the envelope's
// hops to beta, in the order they were dispatched.
func (m *meshPeers) peerNonces(envID string) []string {
	m.t.Helper()
	var out []string
	for _, ev := range m.traceEvents(envID) {
		if ev.State == tracing.Dispatched && ev.Transport == directory.TransportFederation {
			require.Equal(m.t, betaDomain, ev.Details.Extra["peer"])
			n, _ := ev.Details.Extra["peerNonce"].(string)
			require.NotEmpty(m.t, n, "a federation hop names its intent")
			out = append(out, n)
		}
	}
	return out
}

// requireCrossing checks the crossing intent nonce in both directories'
// logs: a legal lifecycle that ends acked, received from the pipeline at
// alpha and from alpha at beta (vouched for by alpha).
func (m *meshPeers) requireCrossing(nonce string) {
	m.t.Helper()
	for _, dir := range []string{m.fp.alpha.DataDir, m.fp.beta.DataDir} {
		var evs []tracing.Event
		require.Eventually(m.t, func() bool {
			// Read-only: the directories are running (readEvents). Trace
			// finds the events once the nonce's row is written behind them.
			lg, err := tracing.OpenReadOnly(context.Background(), filepath.Join(dir, "beam.db"))
			require.NoError(m.t, err)
			defer lg.Close()
			evs, err = lg.Trace(context.Background(), nonce)
			require.NoError(m.t, err)
			return len(evs) > 0 && evs[len(evs)-1].State == tracing.Acked
		}, 60*time.Second, 50*time.Millisecond, "the crossing intent %s is acked in %s", nonce, dir)
		var cur tracing.State
		for _, ev := range evs {
			require.True(m.t, tracing.CanTransition(cur, ev.State), "legal %s -> %s for %s in %s", cur, ev.State, nonce, dir)
			cur = ev.State
		}
		if dir == m.fp.alpha.DataDir {
			require.Equal(m.t, directory.OriginMesh, evs[0].Transport)
			require.True(m.t, slices.ContainsFunc(evs, func(ev tracing.Event) bool {
				return ev.State == tracing.Dispatched && ev.Transport == directory.TransportFederation
			}), "alpha forwarded it over federation")
		} else {
			require.Equal(m.t, directory.OriginFederation, evs[0].Transport)
			require.Equal(m.t, alphaDomain, evs[0].Details.Extra["vouchedBy"])
		}
	}
}

// requireFinished checks a finished envelope: succeeded in x-sink once,
// the payload enriched by all three actors, the route walked.
func (m *meshPeers) requireFinished(v meshView) {
	m.t.Helper()
	require.Equal(m.t, tracing.MeshSucceeded, v.Status, v.Error)
	require.True(m.t, v.Sink)
	require.False(m.t, v.Sump)
	require.Equal(m.t, 3, v.Hop)
	require.Equal(m.t, m.route, v.Envelope.Route.Prev)
	p := payloadMap(m.t, v.Envelope.Payload)
	require.Equal(m.t, "Ice-cream Bourgignon", p["product_name"])
	require.Equal(m.t, "Cook ice-cream in tomato sauce for 3 hours", p["recipe"])
	require.Equal(m.t, "INVALID", p["recipe_eval"])
	states := m.trace(v.ID) // legal, exactly one terminal event
	require.Equal(m.t, tracing.Acked, states[len(states)-1], "x-sink")
}

// TestMeshPeerHopProcesses: two beam serve processes federated over their
// embedded NATS servers. A three-hop envelope created through alpha's
// gateway crosses to beta for its middle hop and comes back; the client's
// SSE stream, the final payload and both directories' traces are checked.
// Then beta is SIGKILLed while it holds the hop and restarted: the
// envelope still ends in x-sink exactly once, succeeded.
func TestMeshPeerHopProcesses(t *testing.T) {
	t.Parallel()
	m := startMeshPeers(t, "4s")

	t.Run("hop in the peer directory", func(t *testing.T) {
		envID := m.create(m.route, map[string]any{"product_id": "123"}, nil)
		v := m.finish(envID) // watches the SSE stream and checks the trace
		m.requireFinished(v)
		require.Equal(t, "123", payloadMap(t, v.Envelope.Payload)["product_id"])
		nonces := m.peerNonces(envID)
		require.Len(t, nonces, 1, "one crossing")
		m.requireCrossing(nonces[0])
		runs, done := m.actor.counts(envID)
		require.Equal(t, 1, runs)
		require.Equal(t, 1, done)
	})

	t.Run("peer killed mid-hop", func(t *testing.T) {
		envID := m.create(m.route, map[string]any{"product_id": "456", "hold": "kill-beta"}, nil)
		ch, done := m.stream(envID, "")
		m.actor.waitReached(t, envID)
		m.fp.beta.Kill()
		m.fp.beta.Restart()
		// The held delivery ends with the old connection.
		m.connectRecipe()

		v := m.wait(envID)
		statuses, _ := m.collect(ch, done)
		require.Equal(t, tracing.MeshSucceeded, statuses[len(statuses)-1])
		require.Contains(t, statuses, tracing.MeshRunning)
		m.requireFinished(v)
		require.Equal(t, "456", payloadMap(t, v.Envelope.Payload)["product_id"])

		nonces := m.peerNonces(envID)
		require.GreaterOrEqual(t, len(nonces), 2, "the interrupted hop was attempted again")
		m.requireCrossing(nonces[len(nonces)-1])
		runs, finished := m.actor.counts(envID)
		require.GreaterOrEqual(t, runs, 2)
		require.GreaterOrEqual(t, finished, 1)

		// Exactly one envelope: no duplicate was created by the retries.
		status, out := m.call(http.MethodGet, "/api/v1/mesh?limit=100", "")
		require.Equal(t, http.StatusOK, status, string(out))
		var list struct {
			Total int `json:"total"`
		}
		require.NoError(t, json.Unmarshal(out, &list))
		require.Equal(t, 2, list.Total, "the two envelopes of this test")
	})
}

// TestMeshPeerHopOnceAcrossOriginCrash: alpha, the directory that routes
// the envelope, is SIGKILLed while beta's actor holds the middle hop. After
// the restart alpha attempts the interrupted hop again under the same
// intent nonce with the same frame, so beta answers it from its own record:
// IN_PROGRESS until the actor finishes, or at once with the cached result
// when the actor finished while alpha was down. Either way the actor runs
// once, the hop's result moves the envelope on once, and the envelope ends
// in x-sink once.
func TestMeshPeerHopOnceAcrossOriginCrash(t *testing.T) {
	t.Parallel()
	m := startMeshPeers(t, "30s")
	t.Run("actor finishes after the restart", func(t *testing.T) {
		m.crashOriginMidHop(t, "kill-alpha", false)
	})
	t.Run("actor finished while the origin was down", func(t *testing.T) {
		m.crashOriginMidHop(t, "kill-alpha-answered", true)
	})
}

// crashOriginMidHop runs one envelope through the pair, SIGKILLs alpha
// while beta's actor holds the middle hop, and checks that the hop ran and
// was applied once. With answered, the actor finishes (and beta records
// the hop acked) before alpha starts again.
func (m *meshPeers) crashOriginMidHop(t *testing.T, hold string, answered bool) {
	envID := m.create(m.route, map[string]any{"product_id": hold, "hold": hold}, nil)
	m.actor.waitReached(t, envID)
	m.fp.alpha.Kill()
	if answered {
		lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(m.fp.alpha.DataDir, "beam.db"), Logger: beamtest.Logger(t)})
		require.NoError(t, err)
		evs, err := lg.Trace(context.Background(), "mesh:"+envID)
		require.NoError(t, err)
		require.NoError(t, lg.Close())
		var nonce string
		for _, ev := range evs {
			if ev.State == tracing.Dispatched && ev.Transport == directory.TransportFederation {
				nonce, _ = ev.Details.Extra["peerNonce"].(string)
			}
		}
		require.NotEmpty(t, nonce)
		close(m.actor.hold(hold))
		require.Eventually(t, func() bool {
			st, err := queryState(t, m.fp.beta.DataDir, nonce)
			return err == nil && st == tracing.Acked
		}, 60*time.Second, 50*time.Millisecond, "beta records the hop acked while alpha is down")
	}
	m.fp.alpha.Restart()
	m.connectAlpha()
	ch, done := m.stream(envID, "")
	if !answered {
		// The restarted alpha asks beta for the hop again while the
		// actor still holds it; beta answers IN_PROGRESS until it is
		// finished.
		require.Eventually(t, func() bool {
			var dispatches int
			for _, ev := range m.traceEvents(envID) {
				if ev.State == tracing.Dispatched && ev.Transport == directory.TransportFederation {
					dispatches++
				}
			}
			return dispatches >= 2
		}, 60*time.Second, 50*time.Millisecond, "the interrupted hop is attempted again after the restart")
		close(m.actor.hold(hold))
	}

	v := m.wait(envID)
	statuses, _ := m.collect(ch, done)
	require.Equal(t, tracing.MeshSucceeded, statuses[len(statuses)-1])
	m.requireFinished(v)
	require.Equal(t, hold, payloadMap(t, v.Envelope.Payload)["product_id"])
	runs, finished := m.actor.counts(envID)
	require.Equal(t, 1, runs, "the actor ran the hop once")
	require.Equal(t, 1, finished)

	// Both dispatches of the middle hop carried the same intent.
	nonces := m.peerNonces(envID)
	require.Len(t, nonces, 2)
	require.Equal(t, nonces[0], nonces[1], "one intent per hop attempt")
	m.requireCrossing(nonces[0])
	// The hop's result moved the envelope on once: one step to the third
	// actor after the middle hop, then x-sink.
	hops := 0
	for _, ev := range m.traceEvents(envID) {
		if st, err := tracing.DecodeMeshStep(ev.Details.Mesh); err == nil && st.Kind == tracing.MeshKindHop && st.Hop == 2 {
			hops++
		}
	}
	require.Equal(t, 1, hops, "the middle hop's result is applied once")

	// alpha forwarded the intent twice (before the crash and after it)
	// and beta delivered it once.
	evs, err := readEvents(m.fp.alpha.DataDir, nonces[0])
	require.NoError(t, err)
	forwards := 0
	var prev tracing.State
	for _, ev := range evs {
		if ev.State == tracing.Dispatched && prev != tracing.Dispatched {
			forwards++
		}
		prev = ev.State
	}
	require.Equal(t, 2, forwards, "alpha forwarded the hop's intent again after the restart")
	evs, err = readEvents(m.fp.beta.DataDir, nonces[0])
	require.NoError(t, err)
	var received, delivered int
	for _, ev := range evs {
		switch ev.State {
		case tracing.Received:
			received++
		case tracing.Delivered:
			delivered++
		}
	}
	require.Equal(t, 1, received)
	require.Equal(t, 1, delivered)
}
