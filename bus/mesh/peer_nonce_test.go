package mesh

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

func TestRedispatchedNonce(t *testing.T) {
	t.Parallel()
	step := func(state tracing.State, s tracing.MeshStep, peerNonce string) tracing.Event {
		ev := tracing.Event{State: state, Details: tracing.Details{Mesh: s.Encode()}}
		if peerNonce != "" {
			ev.Details.Extra = map[string]any{"peer": "beta.beam.directory", "peerNonce": peerNonce}
		}
		return ev
	}
	created := step(tracing.Received, tracing.MeshStep{Kind: tracing.MeshKindCreated}, "")
	queued := step(tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait}, "")
	dispatch := func(attempt int, nonce string) tracing.Event {
		return step(tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindDispatch, Attempt: attempt}, nonce)
	}
	delivered := tracing.Event{State: tracing.Delivered}
	restart := step(tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait, Reason: "interrupted by a restart"}, "")
	hop := step(tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindHop, Hop: 1}, "")
	retry := step(tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindRetry, Attempt: 1}, "")
	takeover := step(tracing.Queued, tracing.MeshStep{Kind: meshKindTakeover, Attempt: 0}, "")
	pause := step(tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindPause, Attempt: 1}, "")

	for _, tc := range []struct {
		name    string
		evs     []tracing.Event
		attempt int
		want    string
	}{
		{"first attempt", []tracing.Event{created, queued}, 1, ""},
		{"interrupted by a restart", []tracing.Event{created, queued, dispatch(1, "n1"), restart}, 1, "n1"},
		{"interrupted after delivery", []tracing.Event{created, queued, dispatch(1, "n1"), delivered, pause, restart}, 1, "n1"},
		{"interrupted, then taken over", []tracing.Event{created, queued, dispatch(1, "n1"), restart, takeover}, 1, "n1"},
		{"a retry is a new attempt", []tracing.Event{created, queued, dispatch(1, "n1"), delivered, retry}, 2, ""},
		{"second attempt interrupted", []tracing.Event{created, dispatch(1, "n1"), retry, dispatch(2, "n2"), restart}, 2, "n2"},
		{"the next hop's first attempt", []tracing.Event{created, dispatch(1, "n1"), delivered, hop}, 1, ""},
		{"eager dispatch of the next hop, interrupted", []tracing.Event{created, dispatch(1, "n1"), hop, dispatch(1, "n2"), restart}, 1, "n2"},
		{"a local hop has no peer nonce", []tracing.Event{created, dispatch(1, ""), restart}, 1, ""},
		{"other attempt", []tracing.Event{created, dispatch(1, "n1"), restart}, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, redispatchedNonce(tc.evs, tc.attempt))
		})
	}
}
