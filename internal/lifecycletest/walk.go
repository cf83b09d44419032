package lifecycletest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// OpenLog opens a log in a temporary directory, closed at the end of the
// test, and returns it with a function that closes and opens it again.
func OpenLog(t *testing.T) (*tracing.Log, func() *tracing.Log) {
	t.Helper()
	cfg := tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Synchronous: "OFF"}
	lg, err := tracing.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lg.Close() })
	return lg, func() *tracing.Log {
		require.NoError(t, lg.Close())
		lg, err = tracing.Open(context.Background(), cfg)
		require.NoError(t, err)
		return lg
	}
}

// Seed returns the seed of a property test, from BEAM_SEED when set, else
// from the clock, and logs it so that a failure can be replayed.
func Seed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("BEAM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "BEAM_SEED")
		seed = v
	}
	t.Logf("seed %d (replay with BEAM_SEED=%d)", seed, seed)
	return seed
}

// gen makes the event of one random operation on nonce, whose canonical
// state is cur ("" for a nonce without events: the event must then carry
// from, to, intentType and the owner). It may make events the lifecycle
// forbids: the walk checks that the log refuses exactly those.
type gen func(rng *rand.Rand, nonce string, cur tracing.State) tracing.Event

// Walk appends steps random events made by gen for a pool of nonces of
// owner (named prefix plus a number), one call each, and requires that the log accepts an event exactly
// when the canonical table and the owner's registered table allow it; then
// that every nonce's trace, read back, makes only allowed transitions; then
// that a full rebuild and a reopen (reopen, when not nil: it closes and
// opens the log again and returns it) leave the projections as the
// appender wrote them.
func Walk(t *testing.T, log *tracing.Log, owner tracing.Owner, prefix string, seed uint64, steps, nonces int, gen gen,
	reopen func() *tracing.Log) (*tracing.Log, []string) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x11fe))
	state := map[string]tracing.State{}
	pool := make([]string, nonces)
	for i := range pool {
		pool[i] = fmt.Sprintf("%s%d-%d", prefix, seed%1000, i)
	}
	accepted, refused := 0, 0
	for range steps {
		nonce := pool[rng.IntN(len(pool))]
		cur := state[nonce]
		ev := gen(rng, nonce, cur)
		want := allowed(owner, cur, &ev)
		_, err := log.Append(ctx, ev)
		if want {
			require.NoError(t, err, "%s: %s -> %s must be accepted", nonce, cur, ev.State)
			state[nonce] = ev.State
			accepted++
			continue
		}
		require.Error(t, err, "%s: %s -> %s (%+v) must be refused", nonce, cur, ev.State, ev.Details.Job)
		var te *tracing.TransitionError
		var le *tracing.LifecycleError
		require.True(t, errors.As(err, &te) || errors.As(err, &le), "refused as an illegal transition: %v", err)
		refused++
	}
	t.Logf("%s: %d events accepted, %d refused", owner, accepted, refused)
	require.Positive(t, accepted)
	require.Positive(t, refused, "the walk tried illegal transitions too")

	// The log holds only allowed transitions.
	for _, nonce := range pool {
		evs, err := log.Trace(ctx, nonce)
		require.NoError(t, err)
		var cur tracing.State
		for _, ev := range evs {
			require.True(t, allowed(owner, cur, &ev), "%s: %s -> %s in the log", nonce, cur, ev.State)
			cur = ev.State
		}
		require.Equal(t, state[nonce], cur)
	}

	before := RequireRebuildEqual(t, log)
	if reopen != nil {
		log = reopen()
		reopened, err := log.Snapshot(ctx)
		require.NoError(t, err)
		require.Equal(t, before, reopened, "the projections survive a reopen")
	}
	return log, pool
}

// RequireRebuildEqual requires that a full rebuild of the log's
// projections (the owners' included) leaves them as they are, and returns
// them.
func RequireRebuildEqual(t *testing.T, log *tracing.Log) map[string]map[string]string {
	t.Helper()
	ctx := context.Background()
	before, err := log.Snapshot(ctx)
	require.NoError(t, err)
	_, err = log.Rebuild(ctx)
	require.NoError(t, err)
	after, err := log.Snapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after, "a full rebuild equals the incremental projections")
	return before
}

// allowed reports whether the log may take ev on a nonce of owner in
// canonical state cur: the canonical table, then the owner's.
func allowed(owner tracing.Owner, cur tracing.State, ev *tracing.Event) bool {
	if !tracing.CanTransition(cur, ev.State) {
		return false
	}
	lc := tracing.LifecycleOf(owner)
	if lc == nil || lc.Step == nil {
		return true
	}
	from, to, on, ok := lc.Step(cur, ev)
	return !ok || lc.Allows(from, to, on)
}
