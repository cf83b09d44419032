package mesh

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/stretchr/testify/require"
)

func TestRouteShift(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   meshRoute
		want meshRoute
	}{
		{"first hop", meshRoute{Prev: []string{}, Curr: "a", Next: []string{"b", "c"}},
			meshRoute{Prev: []string{"a"}, Curr: "b", Next: []string{"c"}}},
		{"last hop", meshRoute{Prev: []string{"a", "b"}, Curr: "c", Next: []string{}},
			meshRoute{Prev: []string{"a", "b", "c"}, Curr: "", Next: []string{}}},
		{"nil slices", meshRoute{Curr: "a"}, meshRoute{Prev: []string{"a"}, Next: []string{}}},
		{"already done", meshRoute{Prev: []string{"a"}}, meshRoute{Prev: []string{"a"}, Next: []string{}}},
	}
	for _, c := range cases {
		got := c.in.Shift()
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, c.want.Curr == "", got.Done(), c.name)
	}
	// Shift never aliases the input.
	in := meshRoute{Prev: make([]string, 1, 8), Curr: "b", Next: []string{"c", "d"}}
	in.Prev[0] = "a"
	out := in.Shift()
	out.Next[0] = "zz"
	out.Prev[0] = "zz"
	require.Equal(t, []string{"c", "d"}, in.Next)
	require.Equal(t, "a", in.Prev[0])
}

func TestNewRoute(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		actors []string
		max    int
		err    error
	}{
		{"ok", []string{"a@x", "b@x"}, 10, nil},
		{"empty", nil, 10, errEmptyRoute},
		{"sink", []string{"a@x", sink}, 10, errReservedActor},
		{"sump", []string{sump}, 10, errReservedActor},
		{"blank", []string{"a@x", ""}, 10, errBadActor},
		{"spaces", []string{"a x"}, 10, errBadActor},
		{"too long", []string{"a", "b", "c"}, 2, errHopLimit},
	}
	for _, c := range cases {
		r, err := wire.NewMeshRoute(c.actors, c.max)
		if c.err != nil {
			require.ErrorIs(t, err, c.err, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.actors[0], r.Curr)
		require.Equal(t, c.actors[1:], r.Next)
		require.Empty(t, r.Prev)
	}
}

func TestRewriteNext(t *testing.T) {
	t.Parallel()
	r := meshRoute{Prev: []string{"a"}, Curr: "b", Next: []string{"c"}}
	cases := []struct {
		name  string
		actor string
		next  []string
		hop   int
		err   error
		want  []string
	}{
		{"current actor prepends", "b", []string{"review", "c"}, 1, nil, []string{"review", "c"}},
		{"current actor clears", "b", []string{}, 1, nil, []string{}},
		{"other actor", "c", []string{"x"}, 1, errNotCurrent, nil},
		{"previous actor", "a", []string{"x"}, 1, errNotCurrent, nil},
		{"nobody", "", []string{"x"}, 1, errNotCurrent, nil},
		{"reserved", "b", []string{sink}, 1, errReservedActor, nil},
		{"loop past the hop limit", "b", []string{"b", "b", "b"}, 7, errHopLimit, nil},
	}
	for _, c := range cases {
		got, err := r.RewriteNext(c.actor, c.next, c.hop, 10)
		if c.err != nil {
			require.ErrorIs(t, err, c.err, c.name)
			require.Equal(t, r, got, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got.Next, c.name)
		require.Equal(t, r.Prev, got.Prev, "prev is read-only")
		require.Equal(t, r.Curr, got.Curr, "curr is read-only")
	}
}

func TestProgressFormula(t *testing.T) {
	t.Parallel()
	r, err := wire.NewMeshRoute([]string{"prep", "infer", "post"}, 10)
	require.NoError(t, err)
	var p float64
	var got []float64
	for !r.Done() {
		p = progress(p, r)
		got = append(got, p)
		r = r.Shift()
	}
	require.InDeltaSlice(t, []float64{100.0 / 3, 200.0 / 3, 100}, got, 1e-9)
	// A rewrite that lengthens the route never lowers progress.
	r2 := meshRoute{Prev: []string{"a"}, Curr: "b", Next: []string{}}
	p = progress(0, r2) // 100
	r3, err := r2.RewriteNext("b", []string{"c", "d", "e"}, 2, 10)
	require.NoError(t, err)
	require.Equal(t, 100.0, progress(p, r3))
}

// TestProgressProperty: random shifts and rewrites never move progress down
// nor above 100.
func TestProgressProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	for range 3000 {
		n := rng.IntN(6) + 1
		actors := make([]string, n)
		for i := range actors {
			actors[i] = "a" + string(rune('a'+i))
		}
		r, err := wire.NewMeshRoute(actors, defaultMaxHops)
		require.NoError(t, err)
		p, hop := 0.0, 0
		for !r.Done() && hop < defaultMaxHops {
			if rng.IntN(3) == 0 {
				next := make([]string, rng.IntN(4))
				for i := range next {
					next[i] = "r" + string(rune('a'+i))
				}
				if r2, err := r.RewriteNext(r.Curr, next, hop, defaultMaxHops); err == nil {
					r = r2
				}
			}
			np := progress(p, r)
			require.GreaterOrEqual(t, np, p)
			require.LessOrEqual(t, np, 100.0)
			p = np
			r = r.Shift()
			hop++
		}
	}
}

func TestPolicyRetry(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	exp := Policy{MaxAttempts: 5, Backoff: backoffExponential, InitialDelay: duration(100 * time.Millisecond), MaxInterval: duration(300 * time.Millisecond)}
	cases := []struct {
		name      string
		p         Policy
		attempt   int
		retryable bool
		now       time.Time
		delay     time.Duration
		reason    string
	}{
		{"exp 1", exp, 1, true, t0, 100 * time.Millisecond, ""},
		{"exp 2", exp, 2, true, t0, 200 * time.Millisecond, ""},
		{"exp capped", exp, 4, true, t0, 300 * time.Millisecond, ""},
		{"exhausted", exp, 5, true, t0, 0, reasonMaxRetries},
		{"non-retryable", exp, 1, false, t0, 0, reasonNonRetryable},
		{"constant", Policy{MaxAttempts: 3, Backoff: backoffConstant, InitialDelay: duration(time.Second)}, 2, true, t0, time.Second, ""},
		{"linear", Policy{MaxAttempts: 5, Backoff: backoffLinear, InitialDelay: duration(time.Second)}, 3, true, t0, 3 * time.Second, ""},
		{"max duration", Policy{MaxAttempts: 9, Backoff: backoffConstant, InitialDelay: duration(time.Second), MaxDuration: duration(2 * time.Second)},
			2, true, t0.Add(1500 * time.Millisecond), 0, reasonMaxDuration},
		{"default policy does not retry", defaultPolicy, 1, true, t0, 0, reasonMaxRetries},
	}
	for _, c := range cases {
		d, reason := c.p.Retry(c.attempt, c.retryable, t0, c.now, 0.5)
		require.Equal(t, c.reason, reason, c.name)
		require.Equal(t, c.delay, d, c.name)
	}
	j := exp
	j.Jitter = true
	require.Equal(t, 50*time.Millisecond, j.Delay(1, 0))
	require.Equal(t, 149*time.Millisecond, j.Delay(1, 0.99).Truncate(time.Millisecond))
	require.Error(t, Policy{MaxAttempts: 0}.Validate())
	require.Error(t, Policy{MaxAttempts: 1, Backoff: "fibonacci"}.Validate())
	require.Error(t, Policy{MaxAttempts: 1, OnExhausted: []string{sump}}.Validate())
}

func TestMergeHeadersKeepsManaged(t *testing.T) {
	t.Parallel()
	cur := map[string]string{headerTraceparent: "00-a-b-01", headerFirstAttempt: "2026-01-01T00:00:00Z", "priority": "high"}
	got := mergeHeaders(cur, map[string]string{headerTraceparent: "evil", headerFirstAttempt: "x", "priority": "", "k": "v"})
	require.Equal(t, map[string]string{headerTraceparent: "00-a-b-01", headerFirstAttempt: "2026-01-01T00:00:00Z", "k": "v"}, got)
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"id":"a","route":{"prev":[],"curr":"x@d","next":["y@d"]},"headers":{"k":"v"},"status":{"phase":"pending"},"payload":{"n":1},"hop":0,"creator":"c@d"}`))
	f.Add([]byte(`{"id":"b","parent_id":"a","route":{"prev":["x"],"curr":"","next":[]},"payload":"ünï","fanout_index":2}`))
	f.Add([]byte(`{"id":"","payload":{}}`))
	f.Add([]byte(`{"id":"c","route":{"curr":"x-sink"},"payload":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEnvelope(b)
		if err != nil {
			return
		}
		// Round trip: what decodes encodes to something that decodes to
		// the same envelope.
		e2, err := decodeEnvelope(encodeEnvelope(e))
		require.NoError(t, err)
		require.Equal(t, e.ID, e2.ID)
		require.Equal(t, e.Route, e2.Route)
		require.Equal(t, e.Headers, e2.Headers)
		require.JSONEq(t, string(e.Payload), string(e2.Payload))
		require.NotContains(t, append(e2.Route.Prev, e2.Route.Next...), sink)
		var generic map[string]any
		require.NoError(t, json.Unmarshal(encodeEnvelope(e), &generic))
	})
}
