package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// create posts body to the gateway and returns the new envelope's id.
func (s *stack) create(body string, auth func(*http.Request, []byte)) string {
	s.t.Helper()
	status, out := s.call(http.MethodPost, "/api/v1/mesh", []byte(body), auth)
	require.Equal(s.t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(s.t, json.Unmarshal(out, &created))
	return created.ID
}

// get reads envelope id.
func (s *stack) get(id string, auth func(*http.Request, []byte)) view {
	s.t.Helper()
	status, out := s.call(http.MethodGet, "/api/v1/mesh/"+id, nil, auth)
	require.Equal(s.t, http.StatusOK, status, string(out))
	var v view
	require.NoError(s.t, json.Unmarshal(out, &v))
	return v
}

// envStatus is the envelope's own status member.
type envStatus struct {
	Phase      string  `json:"phase"`
	DeadlineAt *string `json:"deadline_at"`
}

func statusOfEnvelope(t *testing.T, v view) envStatus {
	t.Helper()
	var st envStatus
	require.NoError(t, json.Unmarshal(v.Envelope.Status, &st))
	return st
}

// TestHopProgressAtReceivedAndProcessing: while an actor works on its hop,
// the envelope's progress already counts the hop's received (10 %) and
// processing (15 %) points of its share, reported by the Go SDK actor and
// the relay's delivered event; the SSE progress events never decrease and
// end at 100.
func TestHopProgressAtReceivedAndProcessing(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{DefaultPolicy: "allow"})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	release := make(chan struct{})
	s.actor("slow@acme.beam.directory", func(ctx context.Context, h *agents.MeshHop) (any, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return h.Envelope.Payload, nil
	})
	s.actor("last@acme.beam.directory", enrich("done", true))

	id := s.create(`{"route":["slow@acme.beam.directory","last@acme.beam.directory"],"payload":{}}`, auth)
	events := s.events(id, auth)
	// Two hops: each is 50 %; processing of the first is 15 % of it, live
	// while its actor works.
	var seen []float64
	progress := func(ev sse) bool {
		if ev.name != "progress" {
			return false
		}
		var p struct {
			Progress float64 `json:"progress"`
		}
		require.NoError(t, json.Unmarshal([]byte(ev.data), &p))
		seen = append(seen, p.Progress)
		return true
	}
	for ev := range events {
		if progress(ev) && seen[len(seen)-1] == 7.5 {
			break
		}
	}
	require.Contains(t, seen, 7.5, "a progress event at the processing point while the actor works: %v", seen)
	require.Less(t, s.get(id, auth).Progress, 7.5, "the processing point is live only, never written")
	close(release)
	v := s.wait(id, auth)
	require.Equal(t, tracing.MeshSucceeded, v.Status, v.Error)
	for ev := range events {
		progress(ev)
	}
	require.Equal(t, 100.0, seen[len(seen)-1], "%v", seen)
	for i := 1; i < len(seen); i++ {
		require.Greater(t, seen[i], seen[i-1], "progress never decreases: %v", seen)
	}
}

// TestRetryShowsRetrying: a failed attempt whose retry the actor's policy
// schedules shows the phase retrying (not running with a reason), then
// running again and succeeded.
func TestRetryShowsRetrying(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{DefaultPolicy: "allow", Pipelines: beam.Pipelines{Policies: []byte(`{"actors":{
		"flaky@acme.beam.directory": {"maxAttempts": 3, "backoff": "constant", "initialDelay": "300ms"}}}`)}})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	var calls atomic.Int32
	s.actor("flaky@acme.beam.directory", func(_ context.Context, h *agents.MeshHop) (any, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("try again")
		}
		return h.Envelope.Payload, nil
	})
	id := s.create(`{"route":["flaky@acme.beam.directory"],"payload":{}}`, auth)
	statuses := s.statuses(id, auth)
	var seen []tracing.MeshStatus
	for st := range statuses {
		if len(seen) == 0 || seen[len(seen)-1] != st {
			seen = append(seen, st)
		}
	}
	require.Contains(t, seen, tracing.MeshRetrying, "%v", seen)
	require.Equal(t, tracing.MeshSucceeded, seen[len(seen)-1], "%v", seen)
	v := s.wait(id, auth)
	require.Equal(t, 2, v.Attempt)
}

// TestMeshStatusOffStreamsNoProgressNorFly: an envelope created with
// x-asya-mesh-status: off streams no progress, no FLY and no intermediate
// status event, only its final state, which GET reads too.
func TestMeshStatusOffStreamsNoProgressNorFly(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{DefaultPolicy: "allow"})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	release := make(chan struct{})
	flown := make(chan error, 1)
	s.actor("a@acme.beam.directory", func(ctx context.Context, h *agents.MeshHop) (any, error) {
		flown <- h.Fly(ctx, map[string]any{"token": "hello"})
		select {
		case <-release:
		case <-ctx.Done():
		}
		return h.Envelope.Payload, nil
	})
	s.actor("b@acme.beam.directory", enrich("b", 1))
	id := s.create(`{"route":["a@acme.beam.directory","b@acme.beam.directory"],"payload":{},
	  "headers":{"x-asya-mesh-status":"off"}}`, auth)
	events := s.events(id, auth)
	require.NoError(t, <-flown)
	close(release)
	var names []string
	var last tracing.MeshRow
	for ev := range events {
		names = append(names, ev.name)
		if ev.name == "status" {
			require.NoError(t, json.Unmarshal([]byte(ev.data), &last))
		}
	}
	require.NotContains(t, names, "progress")
	require.NotContains(t, names, "fly")
	require.LessOrEqual(t, len(names), 2, "the state at subscription and the final one: %v", names)
	require.Equal(t, tracing.MeshSucceeded, last.Status)
	v := s.get(id, auth)
	require.Equal(t, tracing.MeshSucceeded, v.Status)
	require.Equal(t, 100.0, v.Progress)
}

// TestTraceparentInjectedOrKept: an envelope created without a W3C trace
// context gets one; one created with traceparent and tracestate keeps them,
// and its actors see them.
func TestTraceparentInjectedOrKept(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{DefaultPolicy: "allow"})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	seen := make(chan map[string]string, 2)
	s.actor("a@acme.beam.directory", func(_ context.Context, h *agents.MeshHop) (any, error) {
		seen <- h.Envelope.Headers
		return h.Envelope.Payload, nil
	})
	tp := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)

	id := s.create(`{"route":["a@acme.beam.directory"],"payload":{}}`, auth)
	got := (<-seen)["traceparent"]
	require.Regexp(t, tp, got)
	require.Equal(t, got, s.wait(id, auth).Envelope.Headers["traceparent"])

	const given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	id = s.create(`{"route":["a@acme.beam.directory"],"payload":{},
	  "headers":{"traceparent":"`+given+`","tracestate":"vendor=1"}}`, auth)
	h := <-seen
	require.Equal(t, given, h["traceparent"])
	require.Equal(t, "vendor=1", h["tracestate"])
	v := s.wait(id, auth)
	require.Equal(t, given, v.Envelope.Headers["traceparent"])
	require.Equal(t, "vendor=1", v.Envelope.Headers["tracestate"])
}

// TestDeadlineAtOnlyWhenTimeoutGiven: the envelope's status names
// deadline_at only when its creator gave a timeout (the gateway's default
// deadline still bounds it).
func TestDeadlineAtOnlyWhenTimeoutGiven(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{DefaultPolicy: "allow"})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	seen := make(chan json.RawMessage, 2)
	s.actor("a@acme.beam.directory", func(_ context.Context, h *agents.MeshHop) (any, error) {
		raw, err := json.Marshal(h.Envelope.Status)
		if err != nil {
			return nil, err
		}
		seen <- raw
		return h.Envelope.Payload, nil
	})

	id := s.create(`{"route":["a@acme.beam.directory"],"payload":{}}`, auth)
	var st envStatus
	require.NoError(t, json.Unmarshal(<-seen, &st))
	require.Nil(t, st.DeadlineAt, "the actor's envelope names no deadline")
	v := s.wait(id, auth)
	require.Nil(t, statusOfEnvelope(t, v).DeadlineAt, "nor does the stored one")
	require.NotZero(t, v.DeadlineAt, "the gateway's own deadline still bounds it")

	id = s.create(`{"route":["a@acme.beam.directory"],"payload":{},"timeout":"90s"}`, auth)
	require.NoError(t, json.Unmarshal(<-seen, &st))
	require.NotNil(t, st.DeadlineAt)
	v = s.wait(id, auth)
	require.NotNil(t, statusOfEnvelope(t, v).DeadlineAt)
	dl, err := time.Parse(time.RFC3339Nano, *statusOfEnvelope(t, v).DeadlineAt)
	require.NoError(t, err)
	require.Equal(t, v.DeadlineAt, dl.UnixMilli())
}

// TestRequeueKeepsPrev: a requeued dead letter goes on from the actor it
// failed at with route.prev still naming the actors it went through.
func TestRequeueKeepsPrev(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{DefaultPolicy: "allow", AdminToken: "bop_test-operator-token"})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	op := func(r *http.Request, _ []byte) { r.Header.Set("X-Admin-Token", "bop_test-operator-token") }
	s.actor("a@acme.beam.directory", enrich("a", 1))
	var calls atomic.Int32
	release := make(chan struct{})
	s.actor("b@acme.beam.directory", func(ctx context.Context, h *agents.MeshHop) (any, error) {
		if calls.Add(1) == 1 {
			return nil, agents.MeshPermanent(errors.New("not now"))
		}
		// Hold the requeued hop until the test has read the envelope.
		select {
		case <-release:
		case <-ctx.Done():
		}
		return h.Envelope.Payload, nil
	})
	s.actor("c@acme.beam.directory", enrich("c", 1))
	id := s.create(`{"route":["a@acme.beam.directory","b@acme.beam.directory","c@acme.beam.directory"],"payload":{}}`, auth)
	dead := s.wait(id, auth)
	require.Equal(t, tracing.MeshFailed, dead.Status)

	status, out := s.call(http.MethodPost, "/api/v1/mesh/"+id+"/requeue", nil, op)
	require.Equal(t, http.StatusCreated, status, string(out))
	var again struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &again))
	v := s.get(again.ID, auth)
	require.Equal(t, []string{"a@acme.beam.directory"}, v.Envelope.Route.Prev, "prev is kept")
	require.Equal(t, "b@acme.beam.directory", v.Envelope.Route.Curr)
	close(release)
	v = s.wait(again.ID, auth)
	require.Equal(t, tracing.MeshSucceeded, v.Status, v.Error)
	require.Equal(t, []string{"a@acme.beam.directory", "b@acme.beam.directory", "c@acme.beam.directory"}, v.Envelope.Route.Prev)
}

// TestInterruptedHopShowsUnknown: a hop in flight when the directory
// stopped has an outcome nobody can tell; after the restart the envelope
// shows unknown (its hop is dispatched again once its actor is back).
func TestInterruptedHopShowsUnknown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := beam.Config{DataDir: dir, Synchronous: "NORMAL", OpenOrgs: true, DefaultPolicy: "allow", Limits: &beam.Limits{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Pipelines: beam.Pipelines{HopTimeout: time.Minute}}
	srv, err := beam.New(context.Background(), cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	s := &stack{t: t, srv: srv, url: hs.URL}
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	got := make(chan struct{}, 1)
	s.actor("a@acme.beam.directory", func(ctx context.Context, h *agents.MeshHop) (any, error) {
		got <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	id := s.create(`{"route":["a@acme.beam.directory"],"payload":{}}`, auth)
	<-got
	require.Eventually(t, func() bool { return s.get(id, auth).State == tracing.Delivered },
		30*time.Second, 10*time.Millisecond)
	hs.CloseClientConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	hs.Close()

	srv2, err := beam.New(context.Background(), cfg)
	require.NoError(t, err)
	hs2 := httptest.NewServer(srv2.Handler())
	t.Cleanup(func() {
		hs2.CloseClientConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv2.Shutdown(ctx))
		hs2.Close()
	})
	s2 := &stack{t: t, srv: srv2, url: hs2.URL}
	v := s2.get(id, auth)
	require.Equal(t, tracing.MeshUnknown, v.Status, "reason %q", v.Reason)
	require.Equal(t, string(tracing.MeshUnknown), statusOfEnvelope(t, v).Phase)
}
