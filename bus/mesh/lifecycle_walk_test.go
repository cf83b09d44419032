package mesh

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

// TestEnvelopeLifecycleIsTheFoldsRule: the envelope table (Lifecycle)
// allows exactly the status updates the beam_mesh fold applies.
func TestEnvelopeLifecycleIsTheFoldsRule(t *testing.T) {
	t.Parallel()
	for _, cur := range tracing.MeshStatuses {
		for _, next := range tracing.MeshStatuses {
			for _, resume := range []bool{false, true} {
				kind := tracing.MeshKindHop
				if resume {
					kind = tracing.MeshKindResume
				}
				_, ok := tracing.AdvanceMeshStatus(cur, next, resume)
				require.Equal(t, ok, lifecycle.Allows(string(cur), string(next), stepOn(kind)), "%s -> %s by %s", cur, next, kind)
			}
		}
	}
}

// meshKinds are the step kinds a walk picks from.
var meshKinds = []string{tracing.MeshKindDispatch, tracing.MeshKindHop, tracing.MeshKindRetry, tracing.MeshKindWait,
	tracing.MeshKindPause, tracing.MeshKindResume, tracing.MeshKindCancel, tracing.MeshKindSink, tracing.MeshKindFailed,
	tracing.MeshKindProcessing}

// TestEnvelopeLifecycleWalk: random steps of pipeline envelopes, appended
// through the log, leave only canonical transitions in the log; the status
// the fold keeps only ever moves along the envelope table (a step out of
// it is dropped and counted stale); and a rebuild and a reopen give the
// beam_mesh rows the appender wrote.
func TestEnvelopeLifecycleWalk(t *testing.T) {
	t.Parallel()
	lg, reopen := lifecycletest.OpenLog(t)
	seed := lifecycletest.Seed(t)
	lg, nonces := lifecycletest.Walk(t, lg, tracing.OwnerMesh, "mesh:walk-", seed, 800, 30,
		func(rng *rand.Rand, nonce string, cur tracing.State) tracing.Event {
			ev := tracing.Event{Nonce: nonce, State: tracing.States[rng.IntN(len(tracing.States))]}
			st := tracing.MeshStep{Kind: meshKinds[rng.IntN(len(meshKinds))], Attempt: 1 + rng.IntN(3), Hop: rng.IntN(3),
				Progress: float64(rng.IntN(100))}
			if rng.IntN(4) > 0 {
				st.Status = tracing.MeshStatuses[rng.IntN(len(tracing.MeshStatuses))]
			}
			if cur == "" {
				if rng.IntN(4) > 0 {
					ev.State = tracing.Received
				}
				ev.From, ev.To, ev.IntentType = "alice@acme.beam.directory", "bob@acme.beam.directory", "mesh.envelope"
				ev.Details.Owner = tracing.OwnerMesh
				st = tracing.MeshStep{Kind: tracing.MeshKindCreated, ID: nonce, Creator: "alice@acme.beam.directory",
					Status: tracing.MeshPending, Envelope: []byte(`{"id":"e","route":{"prev":[],"curr":"bob","next":["carol"]}}`)}
			}
			ev.Details.Mesh = st.Encode()
			return ev
		}, reopen)

	ctx := context.Background()
	moved := 0
	for _, nonce := range nonces {
		evs, err := lg.Trace(ctx, nonce)
		require.NoError(t, err)
		var m tracing.MeshRow
		for _, ev := range evs {
			prev := m.Status
			m.Apply(ev)
			if m.Status == prev {
				continue
			}
			st, err := tracing.DecodeMeshStep(ev.Details.Mesh)
			require.NoError(t, err)
			require.True(t, lifecycle.Allows(string(prev), string(m.Status), stepOn(st.Kind)) ||
				(prev == "" && st.Kind == tracing.MeshKindCreated), "%s: %s -> %s by %s", nonce, prev, m.Status, st.Kind)
			moved++
		}
	}
	require.Positive(t, moved)
}
