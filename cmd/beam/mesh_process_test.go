package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/apitest"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

const meshOperatorToken = "mesh-operator-token-0123456789"

// meshStack is a real beam serve with the catalog of test actors.
type meshStack struct {
	t       *testing.T
	p       *beamtest.Process
	ctx     context.Context
	creator *agents.Identity
	actors  map[string]string // short name -> Beam ID

	gates     sync.Map     // envelope id -> chan struct{} that releases the "gate" actor
	gateIn    chan string  // ids that reached the gate
	attempts  sync.Map     // actor/envelope -> *atomic.Int32
	afterGate atomic.Int32 // deliveries to the actor after the gate
}

func id(name string) string { return name + "@mesh.beam.directory" }

// startMeshStack starts beam serve with short pipeline timeouts and retry
// policies for the catalog's actors, and connects the actors.
func startMeshStack(t *testing.T) *meshStack {
	t.Helper()
	dir := t.TempDir()
	pol := map[string]any{
		"actors": map[string]any{
			id("flaky"):     map[string]any{"maxAttempts": 3, "backoff": "constant", "initialDelay": "50ms"},
			id("exhaust"):   map[string]any{"maxAttempts": 3, "backoff": "exponential", "initialDelay": "20ms", "maxInterval": "50ms", "jitter": true},
			id("permanent"): map[string]any{"maxAttempts": 5, "backoff": "constant", "initialDelay": "20ms"},
			id("rescue"):    map[string]any{"maxAttempts": 2, "backoff": "linear", "initialDelay": "20ms", "onExhausted": []string{id("medic")}},
		},
	}
	raw, err := json.Marshal(pol)
	require.NoError(t, err)
	polPath := filepath.Join(dir, "policies.json")
	require.NoError(t, os.WriteFile(polPath, raw, 0o600))
	p := beamtest.Start(t, beamtest.Options{
		// The creator and the actors are members of one org (each hop
		// obeys its actor's policy).
		Args: []string{"--mesh-policies", polPath, "--mesh-hop-timeout", "1s", "--allow-insecure-endpoints", "--allow-private-endpoints",
			"--open-orgs"},
		Env: []string{"BEAM_ADMIN_TOKEN=" + meshOperatorToken},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	s := &meshStack{t: t, p: p, ctx: ctx, actors: map[string]string{}, gateIn: make(chan string, 16)}
	s.creator, _ = sdkAgent(t, ctx, p.URL(), id("client"))

	handlers := map[string]agents.MeshHandler{
		"echo": func(ctx context.Context, h *agents.MeshHop) (any, error) { return h.Envelope.Payload, nil },
		"loader": enrich(func(m map[string]any) {
			m["product_name"] = "Ice-cream Bourgignon"
		}),
		"recipe": enrich(func(m map[string]any) {
			m["recipe"] = "Cook ice-cream in tomato sauce for 3 hours"
		}),
		"judge": enrich(func(m map[string]any) {
			m["recipe_eval"] = "INVALID"
			m["recipe_eval_details"] = "Recipe is nonsense"
		}),
		"fanout": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			var in struct {
				Items []string `json:"items"`
			}
			if err := h.Bind(&in); err != nil {
				return nil, agents.MeshPermanent(err)
			}
			for _, it := range in.Items {
				if err := h.Yield(map[string]any{"item": it}); err != nil {
					return nil, err
				}
			}
			return nil, nil
		},
		"router": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			h.SetNext(id("reviewer"), id("echo"))
			h.SetHeader("routed-by", "router")
			h.SetHeader("traceparent", "forged")
			return h.Envelope.Payload, nil
		},
		"reviewer": enrich(func(m map[string]any) { m["reviewed"] = true }),
		"slow": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			<-ctx.Done() // never answers within the hop timeout
			return nil, ctx.Err()
		},
		"error": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			return nil, errors.New("processing_error: invalid input format")
		},
		"flaky": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			if s.count("flaky", h.Envelope.ID) < 3 {
				return nil, errors.New("transient failure")
			}
			return enrichPayload(h, func(m map[string]any) { m["flaky"] = "ok" })
		},
		"exhaust": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			s.count("exhaust", h.Envelope.ID)
			return nil, errors.New("always failing")
		},
		"permanent": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			s.count("permanent", h.Envelope.ID)
			return nil, agents.MeshPermanent(errors.New("bad request, do not retry"))
		},
		"rescue": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			return nil, errors.New("needs rescue")
		},
		"medic": enrich(func(m map[string]any) { m["rescued"] = true }),
		"sinker": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			return nil, nil // nothing: straight to x-sink
		},
		"streamer": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			for i := range 3 {
				if err := h.Fly(ctx, map[string]any{"token": fmt.Sprintf("t%d", i)}); err != nil {
					return nil, err
				}
			}
			return h.Envelope.Payload, nil
		},
		"gate": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			s.gateIn <- h.Envelope.ID
			select {
			case <-s.gateOf(h.Envelope.ID):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return h.Envelope.Payload, nil
		},
		"after": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			s.afterGate.Add(1)
			return h.Envelope.Payload, nil
		},
	}
	for name, h := range handlers {
		ident, _ := sdkAgent(t, ctx, p.URL(), id(name))
		c := sdkClient(t, p.URL(), ident)
		c.HandleMesh(h)
		require.NoError(t, c.Connect(ctx))
		s.actors[name] = ident.BeamID
	}
	return s
}

func (s *meshStack) gateOf(envID string) chan struct{} {
	v, _ := s.gates.LoadOrStore(envID, make(chan struct{}))
	return v.(chan struct{})
}

// release lets the gate actor answer for envID.
func (s *meshStack) release(envID string) { close(s.gateOf(envID)) }

// reached waits until envID is held at the gate.
func (s *meshStack) reached(envID string) {
	s.t.Helper()
	for {
		select {
		case got := <-s.gateIn:
			if got == envID {
				return
			}
		case <-time.After(30 * time.Second):
			require.FailNow(s.t, "the gate was not reached")
		}
	}
}

func (s *meshStack) count(actor, envID string) int32 {
	v, _ := s.attempts.LoadOrStore(actor+"/"+envID, &atomic.Int32{})
	return v.(*atomic.Int32).Add(1)
}

func (s *meshStack) attemptsOf(actor, envID string) int32 {
	v, ok := s.attempts.Load(actor + "/" + envID)
	if !ok {
		return 0
	}
	return v.(*atomic.Int32).Load()
}

func enrichPayload(h *agents.MeshHop, f func(map[string]any)) (any, error) {
	m := map[string]any{}
	if err := h.Bind(&m); err != nil {
		return nil, agents.MeshPermanent(err)
	}
	f(m)
	return m, nil
}

func enrich(f func(map[string]any)) agents.MeshHandler {
	return func(ctx context.Context, h *agents.MeshHop) (any, error) { return enrichPayload(h, f) }
}

// call makes a gateway request with the creator's API key (or the given
// auth header) and returns the status and body.
func (s *meshStack) call(method, path, body string, hdr ...string) (int, []byte) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.ctx, method, s.p.URL()+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	if len(hdr) == 0 {
		req.Header.Set("X-Api-Key", s.creator.APIKey)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, b
}

func (s *meshStack) create(route []string, payload any, extra map[string]any) string {
	s.t.Helper()
	body := map[string]any{"route": route, "payload": payload}
	for k, v := range extra {
		body[k] = v
	}
	raw, err := json.Marshal(body)
	require.NoError(s.t, err)
	status, out := s.call(http.MethodPost, "/api/v1/mesh", string(raw))
	require.Equal(s.t, http.StatusCreated, status, string(out))
	var res struct {
		ID string `json:"id"`
	}
	require.NoError(s.t, json.Unmarshal(out, &res))
	require.NotEmpty(s.t, res.ID)
	return res.ID
}

// meshView is GET /api/v1/mesh/{id}.
type meshView struct {
	tracing.MeshRow
	Envelope struct {
		ID       string            `json:"id"`
		ParentID string            `json:"parent_id"`
		Route    agents.MeshRoute  `json:"route"`
		Headers  map[string]string `json:"headers"`
		Payload  json.RawMessage   `json:"payload"`
		Hop      int               `json:"hop"`
	} `json:"envelope"`
}

func (s *meshStack) get(envID string) meshView {
	s.t.Helper()
	status, out := s.call(http.MethodGet, "/api/v1/mesh/"+envID, "")
	require.Equal(s.t, http.StatusOK, status, string(out))
	var v meshView
	require.NoError(s.t, json.Unmarshal(out, &v))
	return v
}

// wait waits until envelope envID is terminal and returns it.
func (s *meshStack) wait(envID string) meshView {
	s.t.Helper()
	var v meshView
	require.Eventually(s.t, func() bool {
		v = s.get(envID)
		return v.Status.Terminal()
	}, 60*time.Second, 20*time.Millisecond, "envelope %s reaches a terminal status", envID)
	return v
}

// trace returns the canonical states of the envelope's events, checking
// that the sequence is legal.
func (s *meshStack) trace(envID string) []tracing.State {
	s.t.Helper()
	var states []tracing.State
	var cur tracing.State
	for _, ev := range s.traceEvents(envID) {
		require.True(s.t, tracing.CanTransition(cur, ev.State), "legal %s -> %s in %s", cur, ev.State, envID)
		cur = ev.State
		states = append(states, ev.State)
	}
	terminal := 0
	for _, st := range states {
		if st == tracing.Acked || st == tracing.DeadLetter || (st == tracing.Failed) {
			terminal++
		}
	}
	require.Equal(s.t, 1, terminal, "exactly one terminal event in %v", states)
	return states
}

// traceEvents returns the envelope's events through the gateway.
func (s *meshStack) traceEvents(envID string) []tracing.Event {
	s.t.Helper()
	status, out := s.call(http.MethodGet, "/api/v1/mesh/"+envID+"/trace", "")
	require.Equal(s.t, http.StatusOK, status, string(out))
	var tr struct {
		Events []tracing.Event `json:"events"`
	}
	require.NoError(s.t, json.Unmarshal(out, &tr))
	return tr.Events
}

// sseEvent is one event of GET /api/v1/mesh/{id}/events.
type sseEvent struct {
	Name, ID string
	Data     json.RawMessage
}

// stream opens the envelope's SSE stream and collects its events until the
// server closes it.
func (s *meshStack) stream(envID, lastID string) (<-chan sseEvent, <-chan struct{}) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.ctx, http.MethodGet, s.p.URL()+"/api/v1/mesh/"+envID+"/events", nil)
	require.NoError(s.t, err)
	req.Header.Set("X-Api-Key", s.creator.APIKey)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	require.Equal(s.t, "text/event-stream", resp.Header.Get("Content-Type"))
	out := make(chan sseEvent, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Name != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.Name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				ev.ID = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				ev.Data = append(ev.Data, strings.TrimPrefix(line, "data: ")...)
			}
		}
	}()
	return out, done
}

// collect drains a stream until it closes and checks its invariants:
// status never moves backwards, progress never goes down, the last status
// event is terminal.
func (s *meshStack) collect(ch <-chan sseEvent, done <-chan struct{}) (statuses []tracing.MeshStatus, fly []json.RawMessage) {
	s.t.Helper()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		require.FailNow(s.t, "the event stream did not close on a terminal status")
	}
	var progress float64
	var last tracing.MeshStatus
	for ev := range ch {
		switch ev.Name {
		case "status":
			var row tracing.MeshRow
			require.NoError(s.t, json.Unmarshal(ev.Data, &row))
			if last != "" {
				back := row.Status.Order() < last.Order() && !(last == tracing.MeshPaused && row.Status == tracing.MeshRunning)
				require.False(s.t, back, "status %s after %s", row.Status, last)
			}
			require.GreaterOrEqual(s.t, row.Progress, progress)
			progress = row.Progress
			last = row.Status
			statuses = append(statuses, row.Status)
		case "fly":
			fly = append(fly, ev.Data)
		}
	}
	require.NotEmpty(s.t, statuses)
	require.True(s.t, statuses[len(statuses)-1].Terminal(), "the stream ends with a terminal status: %v", statuses)
	return statuses, fly
}

// finish waits until envID is terminal while watching its SSE stream,
// and checks the stream (status never backwards, progress never down,
// ending terminal) and the envelope's trace (legal, one terminal event).
func (s *meshStack) finish(envID string) meshView {
	s.t.Helper()
	ch, done := s.stream(envID, "")
	v := s.wait(envID)
	statuses, _ := s.collect(ch, done)
	require.Equal(s.t, v.Status, statuses[len(statuses)-1], "the stream ends with the envelope's final status")
	s.trace(envID)
	return v
}

func payloadMap(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	m := map[string]any{}
	require.NoError(t, json.Unmarshal(raw, &m))
	return m
}

// TestMeshCatalog runs the catalog of test actors against one real beam
// serve: every envelope's final state, payload, trace and SSE stream.
func TestMeshCatalog(t *testing.T) {
	s := startMeshStack(t)

	t.Run("echo", func(t *testing.T) {
		envID := s.create([]string{id("echo")}, map[string]any{"text": "Hello world"}, nil)
		ch, done := s.stream(envID, "")
		v := s.wait(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.JSONEq(t, `{"text":"Hello world"}`, string(v.Envelope.Payload))
		require.True(t, v.Sink)
		require.False(t, v.Sump)
		require.Equal(t, 100.0, v.Progress)
		require.Equal(t, []string{id("echo")}, v.Envelope.Route.Prev)
		require.NotEmpty(t, v.Envelope.Headers["x-asya-first-attempt"])
		require.Equal(t, []tracing.State{tracing.Received, tracing.Queued, tracing.Dispatched, tracing.Delivered, tracing.Acked}, s.trace(envID))
		statuses, _ := s.collect(ch, done)
		require.Equal(t, tracing.MeshSucceeded, statuses[len(statuses)-1])
	})

	t.Run("enrich three hops", func(t *testing.T) {
		envID := s.create([]string{id("loader"), id("recipe"), id("judge")}, map[string]any{"product_id": "123"}, nil)
		ch, done := s.stream(envID, "")
		v := s.wait(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.JSONEq(t, `{"product_id":"123","product_name":"Ice-cream Bourgignon","recipe":"Cook ice-cream in tomato sauce for 3 hours",
			"recipe_eval":"INVALID","recipe_eval_details":"Recipe is nonsense"}`, string(v.Envelope.Payload))
		require.Equal(t, 3, v.Hop)
		require.Equal(t, []string{id("loader"), id("recipe"), id("judge")}, v.Envelope.Route.Prev)
		states := s.trace(envID)
		require.Equal(t, 3, count(states, tracing.Dispatched))
		statuses, _ := s.collect(ch, done)
		require.Contains(t, statuses, tracing.MeshSucceeded)

		// Resume from the first event: the replay shows every status
		// change again, from the log.
		ch2, done2 := s.stream(envID, "0")
		replayed, _ := s.collect(ch2, done2)
		require.GreaterOrEqual(t, len(replayed), len(states)-1)
		require.Equal(t, tracing.MeshPending, replayed[0])
	})

	t.Run("fan-out", func(t *testing.T) {
		envID := s.create([]string{id("fanout"), id("echo")}, map[string]any{"items": []string{"a", "b", "c"}}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.JSONEq(t, `{"item":"a"}`, string(v.Envelope.Payload), "index 0 keeps the id")
		status, out := s.call(http.MethodGet, "/api/v1/mesh?parent="+envID, "")
		require.Equal(t, http.StatusOK, status, string(out))
		var list struct {
			Messages []meshView `json:"messages"`
			Total    int        `json:"total"`
		}
		require.NoError(t, json.Unmarshal(out, &list))
		require.Equal(t, 2, list.Total)
		items := map[string]bool{}
		for _, c := range list.Messages {
			c = s.wait(c.ID)
			require.Equal(t, tracing.MeshSucceeded, c.Status)
			require.Equal(t, envID, c.ParentID)
			require.Len(t, c.ID, 36)
			require.Equal(t, byte('4'), c.ID[14], "UUID version 4")
			items[payloadMap(t, c.Envelope.Payload)["item"].(string)] = true
			s.trace(c.ID)
		}
		require.Equal(t, map[string]bool{"b": true, "c": true}, items)
	})

	t.Run("route rewrite", func(t *testing.T) {
		envID := s.create([]string{id("router"), id("judge")}, map[string]any{"n": 1}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.Equal(t, []string{id("router"), id("reviewer"), id("echo")}, v.Envelope.Route.Prev, "judge was replaced")
		require.Equal(t, true, payloadMap(t, v.Envelope.Payload)["reviewed"])
		require.Equal(t, "router", v.Envelope.Headers["routed-by"])
		require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, v.Envelope.Headers["traceparent"],
			"a managed header is not taken from the actor: the one injected at creation stays")
		require.Equal(t, 100.0, v.Progress)
	})

	t.Run("timeout", func(t *testing.T) {
		envID := s.create([]string{id("slow"), id("echo")}, map[string]any{"n": 1}, nil)
		ch, done := s.stream(envID, "")
		v := s.wait(envID)
		require.Equal(t, tracing.MeshFailed, v.Status)
		require.True(t, v.Sink)
		require.True(t, v.Sump)
		require.Equal(t, "MaxRetriesExhausted", v.Reason)
		require.Contains(t, v.Error, "TIMEOUT")
		s.trace(envID)
		s.collect(ch, done)
	})

	t.Run("deadline", func(t *testing.T) {
		envID := s.create([]string{id("gate"), id("echo")}, map[string]any{"n": 1}, map[string]any{"timeout": "300ms"})
		s.reached(envID)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshFailed, v.Status)
		require.Equal(t, "Timeout", v.Reason, "the server fails a stalled envelope at its deadline")
		require.True(t, v.Sump)
		s.release(envID)
		s.trace(envID)
	})

	t.Run("error", func(t *testing.T) {
		envID := s.create([]string{id("error")}, map[string]any{"n": 1}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshFailed, v.Status)
		require.Equal(t, "MaxRetriesExhausted", v.Reason, "the default policy makes one attempt")
		require.Contains(t, v.Error, "processing_error")
		require.JSONEq(t, `{"n":1}`, string(v.Envelope.Payload), "x-sink keeps the last payload")
		s.trace(envID)
	})

	t.Run("retry then succeed", func(t *testing.T) {
		envID := s.create([]string{id("flaky")}, map[string]any{"n": 1}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.Equal(t, "ok", payloadMap(t, v.Envelope.Payload)["flaky"])
		require.EqualValues(t, 3, s.attemptsOf("flaky", envID))
		states := s.trace(envID)
		require.Equal(t, 3, count(states, tracing.Dispatched))
	})

	t.Run("retry exhaustion", func(t *testing.T) {
		envID := s.create([]string{id("exhaust"), id("echo")}, map[string]any{"n": 1}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshFailed, v.Status)
		require.Equal(t, "MaxRetriesExhausted", v.Reason)
		require.EqualValues(t, 3, s.attemptsOf("exhaust", envID))
		require.Equal(t, 3, v.Attempt)
		s.trace(envID)
		// Listed as a dead letter; the operator requeues it.
		status, out := s.call(http.MethodGet, "/api/v1/mesh/dead-letters", "")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, string(out), envID)
		status, out = s.call(http.MethodPost, "/api/v1/mesh/"+envID+"/requeue", "")
		require.Equal(t, http.StatusForbidden, status, string(out))
		status, out = s.call(http.MethodPost, "/api/v1/mesh/"+envID+"/requeue", "", "Authorization", "Bearer "+meshOperatorToken)
		require.Equal(t, http.StatusCreated, status, string(out))
		var rq struct {
			ID       string `json:"id"`
			ParentID string `json:"parentId"`
		}
		require.NoError(t, json.Unmarshal(out, &rq))
		require.Equal(t, envID, rq.ParentID)
		again := s.wait(rq.ID)
		require.Equal(t, tracing.MeshFailed, again.Status, "it fails again at the same actor")
		require.Equal(t, tracing.MeshFailed, s.get(envID).Status, "the dead one stays finished")
	})

	t.Run("non-retryable", func(t *testing.T) {
		envID := s.create([]string{id("permanent")}, map[string]any{"n": 1}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshFailed, v.Status)
		require.Equal(t, "NonRetryableFailure", v.Reason)
		require.EqualValues(t, 1, s.attemptsOf("permanent", envID), "a permanent error is not retried despite maxAttempts 5")
		s.trace(envID)
	})

	t.Run("on exhausted reroute", func(t *testing.T) {
		envID := s.create([]string{id("rescue"), id("judge")}, map[string]any{"n": 1}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.Equal(t, true, payloadMap(t, v.Envelope.Payload)["rescued"])
		require.Equal(t, []string{id("rescue"), id("medic")}, v.Envelope.Route.Prev)
		require.Equal(t, "PolicyRouted", v.Reason)
	})

	t.Run("nothing goes to sink", func(t *testing.T) {
		envID := s.create([]string{id("sinker"), id("judge")}, map[string]any{"keep": "me"}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.JSONEq(t, `{"keep":"me"}`, string(v.Envelope.Payload))
		require.Equal(t, []string{id("sinker")}, v.Envelope.Route.Prev, "judge never ran")
	})

	t.Run("large payload", func(t *testing.T) {
		big := strings.Repeat("x", 40<<10)
		envID := s.create([]string{id("echo"), id("loader")}, map[string]any{"blob": big}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.Equal(t, big, payloadMap(t, v.Envelope.Payload)["blob"])
	})

	t.Run("unicode", func(t *testing.T) {
		text := "Grüße, 世界! 🚀 مرحبا \u2028 \"quoted\" <tag> &amp;"
		envID := s.create([]string{id("echo"), id("reviewer")}, map[string]any{"text": text}, map[string]any{"headers": map[string]string{"note": "ünïcode ✓"}})
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.Equal(t, text, payloadMap(t, v.Envelope.Payload)["text"])
		require.Equal(t, "ünïcode ✓", v.Envelope.Headers["note"])
	})

	t.Run("fly events", func(t *testing.T) {
		envID := s.create([]string{id("gate"), id("streamer")}, map[string]any{"n": 1}, nil)
		ch, done := s.stream(envID, "")
		s.reached(envID)
		s.release(envID)
		v := s.wait(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		_, fly := s.collect(ch, done)
		require.Len(t, fly, 3)
		require.JSONEq(t, `{"token":"t0"}`, string(fly[0]))
		// FLY events are never stored.
		status, out := s.call(http.MethodGet, "/api/v1/mesh/"+envID+"/trace", "")
		require.Equal(t, http.StatusOK, status)
		require.NotContains(t, string(out), `"t0"`)
	})

	t.Run("pause and resume", func(t *testing.T) {
		before := s.afterGate.Load()
		envID := s.create([]string{id("gate"), id("after")}, map[string]any{"n": 1}, nil)
		ch, done := s.stream(envID, "")
		s.reached(envID)
		status, out := s.call(http.MethodPost, "/api/v1/mesh/"+envID+"/pause", "")
		require.Equal(t, http.StatusOK, status, string(out))
		require.Equal(t, tracing.MeshPaused, s.get(envID).Status)
		s.release(envID)
		// The hop in flight finishes; the envelope waits, paused.
		require.Eventually(t, func() bool {
			v := s.get(envID)
			return v.State == tracing.Queued && v.Hop == 1
		}, 30*time.Second, 20*time.Millisecond)
		v := s.get(envID)
		require.Equal(t, tracing.MeshPaused, v.Status)
		require.Equal(t, before, s.afterGate.Load(), "a paused envelope is not delivered")
		status, _ = s.call(http.MethodPost, "/api/v1/mesh/"+envID+"/pause", "")
		require.Equal(t, http.StatusConflict, status)
		status, out = s.call(http.MethodPost, "/api/v1/mesh/"+envID+"/resume", "")
		require.Equal(t, http.StatusOK, status, string(out))
		v = s.wait(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		require.Equal(t, before+1, s.afterGate.Load())
		statuses, _ := s.collect(ch, done)
		require.Contains(t, statuses, tracing.MeshPaused)
		s.trace(envID)
	})

	t.Run("cancel mid-route", func(t *testing.T) {
		before := s.afterGate.Load()
		envID := s.create([]string{id("gate"), id("after")}, map[string]any{"n": 1}, nil)
		ch, done := s.stream(envID, "")
		s.reached(envID)
		status, out := s.call(http.MethodDelete, "/api/v1/mesh/"+envID, "")
		require.Equal(t, http.StatusOK, status, string(out))
		status, _ = s.call(http.MethodDelete, "/api/v1/mesh/"+envID, "")
		require.Equal(t, http.StatusOK, status, "cancel is idempotent")
		s.release(envID)
		v := s.wait(envID)
		require.Equal(t, tracing.MeshCanceled, v.Status)
		require.True(t, v.Sink)
		statuses, _ := s.collect(ch, done)
		require.Equal(t, tracing.MeshCanceled, statuses[len(statuses)-1])
		// The late answer of the gate is dropped; after never runs.
		status, _ = s.call(http.MethodPost, "/api/v1/mesh/"+envID+"/resume", "")
		require.Equal(t, http.StatusConflict, status)
		require.Equal(t, before, s.afterGate.Load())
		s.trace(envID)
	})

	t.Run("http actor", func(t *testing.T) {
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			var body struct {
				Intent  string          `json:"intent"`
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Intent != "mesh.envelope" {
				http.Error(w, "bad", http.StatusBadRequest)
				return
			}
			var env agents.MeshEnvelope
			if err := json.Unmarshal(body.Payload, &env); err != nil {
				http.Error(w, "bad", http.StatusBadRequest)
				return
			}
			m := map[string]any{}
			_ = json.Unmarshal(env.Payload, &m)
			m["via"] = "http"
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"mesh": map[string]any{"outputs": []any{m}}})
		}))
		defer srv.Close()
		apitest.Register(t, s.p.URL(), id("webhook"), "webhook", map[string]any{"httpEndpoint": srv.URL})
		envID := s.create([]string{id("loader"), id("webhook"), id("judge")}, map[string]any{"product_id": "9"}, nil)
		v := s.finish(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status, v.Error)
		m := payloadMap(t, v.Envelope.Payload)
		require.Equal(t, "http", m["via"])
		require.Equal(t, "INVALID", m["recipe_eval"])
		require.EqualValues(t, 1, hits.Load())
	})

	t.Run("status off", func(t *testing.T) {
		envID := s.create([]string{id("loader"), id("recipe")}, map[string]any{"n": 1},
			map[string]any{"headers": map[string]string{"x-asya-mesh-status": "off"}})
		ch, done := s.stream(envID, "")
		v := s.wait(envID)
		require.Equal(t, tracing.MeshSucceeded, v.Status)
		statuses, _ := s.collect(ch, done)
		require.LessOrEqual(t, len(statuses), 2, "only the current state and the terminal one: %v", statuses)
		s.trace(envID)
	})

	t.Run("bad input", func(t *testing.T) {
		other, _ := sdkAgent(t, s.ctx, s.p.URL(), id("stranger"))
		mine := s.create([]string{id("gate")}, map[string]any{"n": 1}, nil)
		s.reached(mine)
		defer s.release(mine)
		many := make([]string, 101)
		for i := range many {
			many[i] = id("echo")
		}
		manyJSON, err := json.Marshal(map[string]any{"route": many})
		require.NoError(t, err)
		cases := []struct {
			name, method, path, body string
			hdr                      []string
			status                   int
			code                     string
		}{
			{"unknown actor", "POST", "/api/v1/mesh", `{"route":["nobody@mesh.beam.directory"]}`, nil, 400, "UNKNOWN_ACTOR"},
			{"empty route", "POST", "/api/v1/mesh", `{"route":[],"payload":{}}`, nil, 400, "EMPTY_ROUTE"},
			{"missing route", "POST", "/api/v1/mesh", `{"payload":{}}`, nil, 400, "EMPTY_ROUTE"},
			{"route through x-sink", "POST", "/api/v1/mesh", fmt.Sprintf(`{"route":[%q,"x-sink"]}`, id("echo")), nil, 400, "RESERVED_ACTOR"},
			{"route through x-sump", "POST", "/api/v1/mesh", `{"route":{"curr":"x-sump"}}`, nil, 400, "RESERVED_ACTOR"},
			{"hop limit", "POST", "/api/v1/mesh", string(manyJSON), nil, 400, "HOP_LIMIT"},
			{"oversize payload", "POST", "/api/v1/mesh", fmt.Sprintf(`{"route":[%q],"payload":{"b":%q}}`, id("echo"), strings.Repeat("x", 60<<10)), nil, 413, "PAYLOAD_TOO_LARGE"},
			{"huge body", "POST", "/api/v1/mesh", fmt.Sprintf(`{"route":[%q],"payload":{"b":%q}}`, id("echo"), strings.Repeat("x", 200<<10)), nil, 413, "PAYLOAD_TOO_LARGE"},
			{"not JSON", "POST", "/api/v1/mesh", `{"route":`, nil, 400, "INVALID_JSON"},
			{"bad timeout", "POST", "/api/v1/mesh", fmt.Sprintf(`{"route":[%q],"timeout":"soon"}`, id("echo")), nil, 400, "INVALID_FIELD"},
			{"no credentials", "POST", "/api/v1/mesh", `{}`, []string{"X-Nothing", "1"}, 401, "UNAUTHORIZED"},
			{"wrong key", "GET", "/api/v1/mesh", ``, []string{"X-Api-Key", "bk_nope"}, 401, "UNAUTHORIZED"},
			{"creating as another agent", "POST", "/api/v1/mesh", fmt.Sprintf(`{"route":[%q],"creator":%q}`, id("echo"), id("echo")), nil, 403, "FORBIDDEN"},
			{"unauthorized cancel", "DELETE", "/api/v1/mesh/" + mine, ``, []string{"X-Api-Key", other.APIKey}, 404, "NOT_FOUND"},
			{"unauthorized pause", "POST", "/api/v1/mesh/" + mine + "/pause", ``, []string{"X-Api-Key", other.APIKey}, 404, "NOT_FOUND"},
			{"others' envelope", "GET", "/api/v1/mesh/" + mine, ``, []string{"X-Api-Key", other.APIKey}, 404, "NOT_FOUND"},
			{"others' events", "GET", "/api/v1/mesh/" + mine + "/events", ``, []string{"X-Api-Key", other.APIKey}, 404, "NOT_FOUND"},
			{"missing envelope", "GET", "/api/v1/mesh/does-not-exist", ``, nil, 404, "NOT_FOUND"},
			{"cancel without credentials", "DELETE", "/api/v1/mesh/" + mine, ``, []string{"X-Nothing", "1"}, 401, "UNAUTHORIZED"},
			{"bad status filter", "GET", "/api/v1/mesh?status=done", ``, nil, 400, "INVALID_FIELD"},
			{"bad limit", "GET", "/api/v1/mesh?limit=-1", ``, nil, 400, "INVALID_FIELD"},
			{"operator without creator", "POST", "/api/v1/mesh", fmt.Sprintf(`{"route":[%q]}`, id("echo")), []string{"Authorization", "Bearer " + meshOperatorToken}, 400, "INVALID_FIELD"},
			{"resume a running one", "POST", "/api/v1/mesh/" + mine + "/resume", ``, nil, 409, "CONFLICT"},
			{"fly by a stranger", "POST", "/api/v1/mesh/" + mine + "/fly", `{"data":1}`, []string{"X-Api-Key", other.APIKey}, 404, "NOT_FOUND"},
		}
		for _, c := range cases {
			status, out := s.call(c.method, c.path, c.body, c.hdr...)
			require.Equal(t, c.status, status, "%s: %s", c.name, out)
			var e struct {
				Error     string `json:"error"`
				ErrorCode string `json:"errorCode"`
			}
			require.NoError(t, json.Unmarshal(out, &e), c.name)
			require.Equal(t, c.code, e.ErrorCode, c.name)
			require.NotEmpty(t, e.Error, c.name)
		}
		// Last-Event-ID must be a number.
		status, _ := s.call("GET", "/api/v1/mesh/"+mine+"/events", "", "X-Api-Key", s.creator.APIKey, "Last-Event-ID", "abc")
		require.Equal(t, 400, status)
		// The stranger's list is empty; the operator sees everything.
		status, out := s.call("GET", "/api/v1/mesh", "", "X-Api-Key", other.APIKey)
		require.Equal(t, 200, status)
		require.Contains(t, string(out), `"total":0`)
		status, out = s.call("GET", "/api/v1/mesh?limit=1", "", "Authorization", "Bearer "+meshOperatorToken)
		require.Equal(t, 200, status)
		require.NotContains(t, string(out), `"total":0`)
	})

	t.Run("cli", func(t *testing.T) {
		auth := []string{"--url", s.p.URL(), "--api-key", s.creator.APIKey}
		mesh := func(args ...string) (string, error) {
			full := append([]string{"mesh", args[0]}, auth...)
			return beamtest.Run(t, s.ctx, append(full, args[1:]...)...)
		}
		out, err := mesh("create", "--route", id("loader")+","+id("recipe"), "--payload", `{"product_id":"cli"}`, "--header", "priority=high")
		require.NoError(t, err, out)
		var created struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &created), out)
		out, err = mesh("watch", created.ID)
		require.NoError(t, err, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.True(t, strings.HasPrefix(lines[len(lines)-1], "status "), out)
		require.Contains(t, lines[len(lines)-1], `"status":"succeeded"`)
		out, err = mesh("get", created.ID)
		require.NoError(t, err, out)
		require.Contains(t, out, `"recipe":"Cook ice-cream in tomato sauce for 3 hours"`)
		require.Contains(t, out, `"priority":"high"`)
		out, err = mesh("list", "--status", "succeeded", "--limit", "500")
		require.NoError(t, err, out)
		require.Contains(t, out, created.ID)
		out, err = mesh("pause", created.ID)
		require.Error(t, err)
		require.Contains(t, out, "CONFLICT")
		out, err = mesh("create", "--route", "x-sink")
		require.Error(t, err)
		require.Contains(t, out, "RESERVED_ACTOR")
	})

	// beam replay folds the same beam_mesh from the log.
	s.p.Stop()
	lg := openLog(t, s.p.DataDir)
	requireProjectionsEqualRebuild(t, lg)
	rows, err := lg.MeshRows(context.Background())
	require.NoError(t, err)
	require.Greater(t, len(rows), 20)
}

func count(states []tracing.State, st tracing.State) int {
	n := 0
	for _, s := range states {
		if s == st {
			n++
		}
	}
	return n
}
