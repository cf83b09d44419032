package tracing_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

// TestIntentLifecycleWalk: random steps of directory intents, appended
// through the log, leave only transitions of the intent table in the log,
// and a rebuild and a reopen give the rows the appender wrote.
func TestIntentLifecycleWalk(t *testing.T) {
	t.Parallel()
	lg, reopen := lifecycletest.OpenLog(t)
	seed := lifecycletest.Seed(t)
	lifecycletest.Walk(t, lg, tracing.OwnerDirectory, "intent-", seed, 600, 40,
		func(rng *rand.Rand, nonce string, cur tracing.State) tracing.Event {
			ev := tracing.Event{Nonce: nonce, State: tracing.States[rng.IntN(len(tracing.States))], Transport: "ws"}
			if cur == "" {
				if rng.IntN(4) > 0 {
					ev.State = tracing.Received
				}
				ev.From, ev.To, ev.IntentType = "a@acme.beam.directory", "b@acme.beam.directory", "task.run"
				ev.Details.Owner = tracing.OwnerDirectory
			}
			if ev.State == tracing.Failed || ev.State == tracing.DeadLetter {
				ev.Details.ErrorCode = "TIMEOUT"
			}
			return ev
		}, reopen)
}

// TestLifecycleTablesAreWellFormed: every registered table names only its
// own states, starts somewhere, and its Allows answers from the table.
func TestLifecycleTablesAreWellFormed(t *testing.T) {
	t.Parallel()
	lc := tracing.IntentLifecycle
	require.Equal(t, []string{"received"}, lc.Initial())
	for _, from := range append([]tracing.State{""}, tracing.States...) {
		for _, to := range tracing.States {
			require.Equal(t, lc.Allows(string(from), string(to), ""), tracing.CanTransition(from, to), "%s -> %s", from, to)
		}
	}
	require.False(t, tracing.CanTransition(tracing.Acked, tracing.Acked), "acked is final")
	require.True(t, tracing.CanTransition(tracing.Failed, tracing.Failed), "an annotation")
	require.Panics(t, func() {
		tracing.Register(&tracing.Lifecycle{Name: "intent", Package: "x", States: []string{"a"},
			Transitions: []tracing.Transition{{To: "a"}}})
	}, "a second lifecycle of one name")
	require.Panics(t, func() {
		tracing.Register(&tracing.Lifecycle{Name: "broken", Package: "x", States: []string{"a"},
			Transitions: []tracing.Transition{{From: "a", To: "b"}}})
	}, "a table naming an unknown state")
}
