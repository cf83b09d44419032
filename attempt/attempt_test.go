package attempt

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffGrowth(t *testing.T) {
	exp := Backoff{Initial: 100 * time.Millisecond}
	require.Equal(t, 100*time.Millisecond, exp.Delay(1, 0.3))
	require.Equal(t, 200*time.Millisecond, exp.Delay(2, 0.3))
	require.Equal(t, 800*time.Millisecond, exp.Delay(4, 0.3))
	require.Equal(t, maxBase, exp.Delay(10_000, 0), "a huge attempt number stays bounded")

	require.Equal(t, 300*time.Millisecond, Backoff{Growth: Linear, Initial: 100 * time.Millisecond}.Delay(3, 0))
	require.Equal(t, 100*time.Millisecond, Backoff{Growth: Constant, Initial: 100 * time.Millisecond}.Delay(7, 0))

	capped := Backoff{Initial: time.Second, Max: 5 * time.Second}
	require.Equal(t, 4*time.Second, capped.Delay(3, 0))
	require.Equal(t, 5*time.Second, capped.Delay(4, 0))

	sched := Backoff{Growth: Scheduled, Schedule: []time.Duration{time.Second, 3 * time.Second}}
	require.Equal(t, time.Second, sched.Delay(0, 0), "n below 1 counts as the first failure")
	require.Equal(t, 3*time.Second, sched.Delay(2, 0))
	require.Equal(t, 3*time.Second, sched.Delay(9, 0), "the last entry repeats")
}

// TestBackoffJitterBounds checks, for random backoffs and draws, that the
// delay stays within the jitter's band around the base (never below the
// floor unless the base is), that the spread adds at most Spread, and that
// the same draw gives the same delay.
func TestBackoffJitterBounds(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for range 5000 {
		b := Backoff{
			Growth:  []Growth{Exponential, Linear, Constant}[r.IntN(3)],
			Initial: time.Duration(r.Int64N(int64(time.Minute))),
			Jitter:  r.Float64(),
			Floor:   time.Duration(r.Int64N(int64(10 * time.Second))),
			Spread:  time.Duration(r.Int64N(int64(2 * time.Second))),
		}
		require.NoError(t, b.Validate())
		n, u := 1+r.IntN(40), r.Float64()
		base, d := b.Base(n), b.Delay(n, u)
		lo := max(time.Duration(float64(base)*(1-b.Jitter))-1, min(b.Floor, base))
		hi := time.Duration(float64(base)*(1+b.Jitter)) + b.Spread + 1
		require.GreaterOrEqual(t, d, lo-1, "%+v n=%d u=%v", b, n, u)
		require.LessOrEqual(t, d, hi, "%+v n=%d u=%v", b, n, u)
		require.Equal(t, d, b.Delay(n, u))
		require.LessOrEqual(t, b.Base(n), b.Base(n+1), "the base never shrinks")
	}
}

func TestBackoffValidate(t *testing.T) {
	for _, b := range []Backoff{
		{Growth: "fibonacci"},
		{Growth: Scheduled},
		{Growth: Scheduled, Schedule: []time.Duration{0}},
		{Jitter: 1.5},
		{Initial: -1},
		{Max: -1},
	} {
		require.Error(t, b.Validate(), "%+v", b)
	}
	require.NoError(t, Backoff{Growth: Scheduled, Schedule: []time.Duration{time.Second}, Jitter: 0.15}.Validate())
}

func TestDecide(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	p := Policy{Backoff: Backoff{Growth: Constant, Initial: time.Second}, MaxAttempts: 3, MaxDuration: 10 * time.Second}

	v := p.Decide(Failure{N: 1, Retryable: true, First: now, Now: now})
	require.Equal(t, Verdict{Retry: true, Delay: time.Second, At: now.Add(time.Second)}, v)

	require.Equal(t, Exhausted, p.Decide(Failure{N: 3, Retryable: true, Now: now}).Reason)
	require.Equal(t, NotRetryable, p.Decide(Failure{N: 1, Now: now}).Reason)
	require.Equal(t, OutOfTime, p.Decide(Failure{N: 2, Retryable: true, First: now.Add(-10 * time.Second), Now: now}).Reason)
	require.Equal(t, OutOfTime, p.Decide(Failure{N: 1, Retryable: true, Now: now, Deadline: now.Add(time.Second)}).Reason,
		"a retry at the deadline is too late")
	require.True(t, p.Decide(Failure{N: 1, Retryable: true, Now: now, Deadline: now.Add(2 * time.Second)}).Retry)

	unlimited := Policy{Backoff: Backoff{Initial: time.Millisecond}}
	require.True(t, unlimited.Decide(Failure{N: 1_000, Retryable: true, Now: now}).Retry)
}

// TestDueOrdersLikeASortedList drives a Due and a plain map with the same
// random operations and checks that PopDue returns what sorting the map
// would.
func TestDueOrdersLikeASortedList(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	var d Due[int]
	model := map[int]time.Time{}
	base := time.Unix(0, 0)
	now := base
	for range 20_000 {
		k := r.IntN(200)
		switch op := r.IntN(10); {
		case op < 5:
			at := now.Add(time.Duration(r.IntN(1000)) * time.Millisecond)
			d.Set(k, at)
			model[k] = at
		case op < 7:
			_, in := model[k]
			require.Equal(t, in, d.Remove(k))
			delete(model, k)
		case op < 8:
			at, ok := d.When(k)
			want, in := model[k]
			require.Equal(t, in, ok)
			require.True(t, want.Equal(at))
		default:
			now = now.Add(time.Duration(r.IntN(300)) * time.Millisecond)
			limit := r.IntN(5)
			got := d.PopDue(now, limit)
			var due []int
			for key, at := range model {
				if !at.After(now) {
					due = append(due, key)
				}
			}
			sort.Slice(due, func(i, j int) bool { return model[due[i]].Before(model[due[j]]) })
			if limit > 0 && len(due) > limit {
				// Equal times may come in either order among keys; compare
				// the times of what was popped.
				due = due[:limit]
			}
			require.Len(t, got, len(due))
			for i := range got {
				require.True(t, model[got[i]].Equal(model[due[i]]), "pop %d", i)
				require.False(t, model[got[i]].After(now))
			}
			for _, key := range got {
				delete(model, key)
			}
		}
		require.Equal(t, len(model), d.Len())
		if k, at, ok := d.Next(); ok {
			for _, m := range model {
				require.False(t, m.Before(at), "Next is the earliest")
			}
			require.True(t, model[k].Equal(at))
		}
	}
}

func TestKeyedSerializesOneKey(t *testing.T) {
	var l Keyed
	var inside atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				unlock := l.Lock("nonce-1")
				require.Equal(t, int32(1), inside.Add(1), "two holders of one key")
				inside.Add(-1)
				unlock()
			}
		}()
	}
	wg.Wait()
}

func TestLoopTicksOnKickAndCloses(t *testing.T) {
	ticks := make(chan struct{}, 16)
	l := &Loop{Interval: time.Hour, Name: "test", Tick: func(context.Context) error {
		ticks <- struct{}{}
		return errors.New("logged, not fatal")
	}}
	l.Kick() // before Start: remembered
	l.Start(context.Background())
	<-ticks
	l.Kick()
	<-ticks
	l.Close()
	l.Close()
	l.Start(context.Background()) // after Close: nothing
	l.Kick()
	select {
	case <-ticks:
		t.Fatal("a closed loop ticked")
	case <-l.Stopping():
	}
}

func TestLoopStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := atomic.Int32{}
	l := &Loop{Interval: time.Millisecond, Tick: func(context.Context) error { n.Add(1); return nil }}
	l.Start(ctx)
	require.Eventually(t, func() bool { return n.Load() > 2 }, 5*time.Second, time.Millisecond)
	cancel()
	l.Close()
	after := n.Load()
	require.Equal(t, after, n.Load())
}
