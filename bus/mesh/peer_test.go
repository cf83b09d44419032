package mesh_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

func enrich(key string, value any) agents.MeshHandler {
	return func(ctx context.Context, h *agents.MeshHop) (any, error) {
		m := map[string]any{}
		if err := h.Bind(&m); err != nil {
			return nil, agents.MeshPermanent(err)
		}
		m[key] = value
		return m, nil
	}
}

// sse is one event of an envelope's SSE stream.
type sse struct{ name, data string }

// events opens envelope id's SSE stream and returns a channel that gets its
// events, closed when the server ends the stream.
func (s *stack) events(id string, auth func(*http.Request, []byte)) <-chan sse {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+"/api/v1/mesh/"+id+"/events", nil)
	require.NoError(s.t, err)
	auth(req, nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	out := make(chan sse, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					out <- ev
				}
				ev = sse{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data += strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out
}

// statuses is the statuses of envelope id's SSE stream.
func (s *stack) statuses(id string, auth func(*http.Request, []byte)) <-chan tracing.MeshStatus {
	s.t.Helper()
	in := s.events(id, auth)
	out := make(chan tracing.MeshStatus, 64)
	go func() {
		defer close(out)
		for ev := range in {
			var row tracing.MeshRow
			if ev.name == "status" && json.Unmarshal([]byte(ev.data), &row) == nil {
				out <- row.Status
			}
		}
	}()
	return out
}

// TestHopInPeerDirectory: a route may name an agent of a peer directory.
// The envelope's middle hop crosses federation (embedded NATS, pinned
// directory keys) as an intent of its own, is delivered at beta to b over
// its WebSocket session, and the envelope completes at alpha with the
// payload enriched by every actor, each directory holding a legal trace of
// the crossing and the client's SSE stream ending in succeeded.
func TestHopInPeerDirectory(t *testing.T) {
	t.Parallel()
	cfg := func(domain string) beam.Config {
		return beam.Config{Domain: domain, Federation: beam.Federation{NATSListen: "127.0.0.1:0"}, DefaultPolicy: "allow"}
	}
	alpha := startStack(t, cfg("alpha.beam.directory"))
	beta := startStack(t, cfg("beta.beam.directory"))
	ctx := context.Background()
	require.NoError(t, alpha.srv.Federation().AddPeer(ctx, beta.srv.Federation().Self()))
	require.NoError(t, beta.srv.Federation().AddPeer(ctx, alpha.srv.Federation().Self()))

	creator, _ := alpha.agent("creator@alpha.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	alpha.actor("loader@alpha.beam.directory", enrich("product_name", "Ice-cream Bourgignon"))
	var atB atomic.Pointer[agents.MeshEnvelope]
	beta.actor("recipe@beta.beam.directory", func(ctx context.Context, h *agents.MeshHop) (any, error) {
		env := h.Envelope
		atB.Store(&env)
		return enrich("recipe", "Cook ice-cream in tomato sauce for 3 hours")(ctx, h)
	})
	alpha.actor("judge@alpha.beam.directory", enrich("recipe_eval", "INVALID"))

	route := []string{"loader@alpha.beam.directory", "recipe@beta.beam.directory", "judge@alpha.beam.directory"}
	body, err := json.Marshal(map[string]any{"route": route, "payload": map[string]any{"product_id": "123"}})
	require.NoError(t, err)
	status, out := alpha.call(http.MethodPost, "/api/v1/mesh", body, auth)
	require.Equal(t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &created))
	stream := alpha.statuses(created.ID, auth)

	v := alpha.wait(created.ID, auth)
	require.Equal(t, tracing.MeshSucceeded, v.Status, v.Error)
	require.JSONEq(t, `{"product_id":"123","product_name":"Ice-cream Bourgignon",
		"recipe":"Cook ice-cream in tomato sauce for 3 hours","recipe_eval":"INVALID"}`, string(v.Envelope.Payload))
	require.Equal(t, route, v.Envelope.Route.Prev)
	require.Equal(t, 3, v.Hop)
	require.True(t, v.Sink)

	// b got the whole envelope as it stood after the first hop.
	seen := atB.Load()
	require.NotNil(t, seen)
	require.Equal(t, created.ID, seen.ID)
	require.Equal(t, creator.BeamID, seen.Creator)
	require.Equal(t, "recipe@beta.beam.directory", seen.Route.Curr)
	require.Equal(t, []string{"loader@alpha.beam.directory"}, seen.Route.Prev)
	require.Contains(t, string(seen.Payload), "Ice-cream Bourgignon")

	// The envelope's trace at alpha: a legal lifecycle whose middle
	// dispatch went over federation and names the crossing intent.
	status, out = alpha.call(http.MethodGet, "/api/v1/mesh/"+created.ID+"/trace", nil, auth)
	require.Equal(t, http.StatusOK, status, string(out))
	var tr struct {
		Events []tracing.Event `json:"events"`
	}
	require.NoError(t, json.Unmarshal(out, &tr))
	var cur tracing.State
	var peerNonce string
	dispatches := 0
	for _, ev := range tr.Events {
		require.True(t, tracing.CanTransition(cur, ev.State), "legal %s -> %s", cur, ev.State)
		cur = ev.State
		if ev.State == tracing.Dispatched {
			dispatches++
			if ev.Transport == directory.TransportFederation {
				require.Equal(t, "beta.beam.directory", ev.Details.Extra["peer"])
				peerNonce, _ = ev.Details.Extra["peerNonce"].(string)
			}
		}
	}
	require.Equal(t, tracing.Acked, cur)
	require.Equal(t, 3, dispatches)
	require.NotEmpty(t, peerNonce, "the federation hop names its intent")

	// The crossing intent has a full trace on both sides.
	want := []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}
	for _, s := range []*stack{alpha, beta} {
		require.Eventually(t, func() bool {
			evs, err := s.srv.Log().Trace(ctx, peerNonce)
			require.NoError(t, err)
			// The origin's outbox steps repeat the intent's state
			// (dispatched) as events of their own: fold the repeats.
			var got []tracing.State
			for _, ev := range evs {
				if len(got) == 0 || got[len(got)-1] != ev.State {
					got = append(got, ev.State)
				}
			}
			return slices.Equal(got, want)
		}, 10*time.Second, 20*time.Millisecond)
	}
	evs, err := alpha.srv.Log().Trace(ctx, peerNonce)
	require.NoError(t, err)
	require.Equal(t, directory.OriginMesh, evs[0].Transport)
	require.Equal(t, directory.TransportFederation, evs[2].Transport)
	evs, err = beta.srv.Log().Trace(ctx, peerNonce)
	require.NoError(t, err)
	require.Equal(t, directory.OriginFederation, evs[0].Transport)
	require.Equal(t, "alpha.beam.directory", evs[0].Details.Extra["vouchedBy"])

	// The client's stream ended with the terminal status, never going back.
	var last tracing.MeshStatus
	for st := range stream {
		require.GreaterOrEqual(t, st.Order(), last.Order(), "%s after %s", st, last)
		last = st
	}
	require.Equal(t, tracing.MeshSucceeded, last)

	// A route naming an agent of a domain no pinned peer serves is refused.
	status, out = alpha.call(http.MethodPost, "/api/v1/mesh", []byte(`{"route":["x@gamma.beam.directory"]}`), auth)
	require.Equal(t, http.StatusBadRequest, status, string(out))
	require.Equal(t, "UNKNOWN_ACTOR", errorCode(t, out))
}
