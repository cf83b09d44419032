package web

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// TestMeshDetailRowAgreesWithItsHops: the envelope detail answers the row
// and the hops as of one point of the log while the envelope moves on. The
// row is read from the writer's memory and the trace from SQLite after it;
// a commit between the two reads used to give a row older than its hops (a
// finished envelope shown running next to its completed hops, and nothing
// later in the log to make the page load it again).
func TestMeshDetailRowAgreesWithItsHops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const hops = 400
	const id = "agree"
	nonce := "mesh:" + id
	step := func(state tracing.State, st tracing.MeshStep) tracing.Event {
		return tracing.Event{Nonce: nonce, State: state, Transport: "mesh", Attempt: st.Attempt,
			Details: tracing.Details{Mesh: st.Encode()}}
	}
	created := step(tracing.Received, tracing.MeshStep{Kind: tracing.MeshKindCreated, ID: id,
		Creator: "alice@acme.beam.directory", Status: tracing.MeshPending, Envelope: []byte(`{"id":"agree"}`)})
	created.From, created.To, created.IntentType = "alice@acme.beam.directory", "a0@acme.beam.directory", "mesh.envelope"
	created.Details.Owner = tracing.OwnerMesh
	_, err := b.log.Append(ctx, created, step(tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait}))
	require.NoError(t, err)

	moved := make(chan error, 1)
	go func() {
		moved <- func() error {
			for i := range hops {
				actor := fmt.Sprintf("a%d@acme.beam.directory", i)
				progress := float64(i+1) * 100 / hops
				if _, err := b.log.Append(ctx, step(tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindDispatch,
					Status: tracing.MeshRunning, Actor: actor, Attempt: 1})); err != nil {
					return err
				}
				if i == hops-1 {
					break
				}
				if _, err := b.log.Append(ctx, step(tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindHop,
					Hop: i + 1, Progress: progress})); err != nil {
					return err
				}
			}
			_, err := b.log.Append(ctx, tracing.Event{Nonce: nonce, State: tracing.Delivered, Transport: "mesh"},
				step(tracing.Acked, tracing.MeshStep{Kind: tracing.MeshKindSink, Status: tracing.MeshSucceeded,
					Hop: hops, Progress: 100, Sink: true}))
			return err
		}()
	}()

	c := b.client()
	reads := 0
	for {
		r := do(t, c, b.req(http.MethodGet, "/observability/mesh/"+id, nil, "Accept", "application/json",
			"Authorization", "Bearer "+viewerToken))
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		var got struct {
			Envelope tracing.MeshRow `json:"envelope"`
			Hops     []meshHop       `json:"hops"`
		}
		r.decode(t, &got)
		reads++
		env := got.Envelope
		done := 0
		for _, h := range got.Hops {
			if h.Outcome == "done" {
				done++
			}
		}
		running := len(got.Hops) > 0 && got.Hops[len(got.Hops)-1].Outcome == "running"
		require.Equal(t, env.Hop, done, "read %d: the row counts %d hops done, the trace %d", reads, env.Hop, done)
		require.Equal(t, env.State == tracing.Dispatched || env.State == tracing.Delivered, running,
			"read %d: row state %s, last hop running %v", reads, env.State, running)
		if env.Status.Terminal() {
			require.Equal(t, tracing.MeshSucceeded, env.Status)
			require.Len(t, got.Hops, hops)
			break
		}
	}
	require.NoError(t, <-moved)
}
