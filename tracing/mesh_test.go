package tracing

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdvanceMeshStatusTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cur, next MeshStatus
		resume    bool
		want      MeshStatus
		ok        bool
	}{
		{"", MeshPending, false, MeshPending, true},
		{MeshPending, MeshRunning, false, MeshRunning, true},
		{MeshRunning, MeshRunning, false, MeshRunning, true},
		{MeshRunning, MeshPending, false, MeshRunning, false},
		{MeshRunning, MeshPaused, false, MeshPaused, true},
		{MeshPaused, MeshRunning, false, MeshPaused, false},
		{MeshPaused, MeshRunning, true, MeshRunning, true},
		{MeshRunning, MeshRunning, true, MeshRunning, false},
		{MeshPaused, MeshCanceled, false, MeshCanceled, true},
		{MeshRunning, MeshSucceeded, false, MeshSucceeded, true},
		{MeshSucceeded, MeshFailed, false, MeshSucceeded, false},
		{MeshCanceled, MeshRunning, true, MeshCanceled, false},
		{MeshFailed, MeshFailed, false, MeshFailed, false},
		{MeshRunning, "bogus", false, MeshRunning, false},
		{MeshRunning, MeshRetrying, false, MeshRetrying, true},
		{MeshRetrying, MeshRunning, false, MeshRunning, true},
		{MeshRunning, MeshUnknown, false, MeshUnknown, true},
		{MeshUnknown, MeshRunning, false, MeshRunning, true},
		{MeshRetrying, MeshPending, false, MeshRetrying, false},
		{MeshPaused, MeshRetrying, false, MeshPaused, false},
		{MeshPaused, MeshUnknown, true, MeshPaused, false},
		{MeshRetrying, MeshPaused, false, MeshPaused, true},
		{MeshUnknown, MeshFailed, false, MeshFailed, true},
	}
	for _, c := range cases {
		got, ok := AdvanceMeshStatus(c.cur, c.next, c.resume)
		require.Equal(t, c.want, got, "%s -> %s resume=%v", c.cur, c.next, c.resume)
		require.Equal(t, c.ok, ok, "%s -> %s resume=%v", c.cur, c.next, c.resume)
	}
}

// TestAdvanceMeshStatusProperty: random update sequences never move the
// status backwards, never leave a terminal status, and leave paused only
// through a resume.
func TestAdvanceMeshStatusProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		cur := MeshStatus("")
		for range rng.IntN(20) + 1 {
			next := MeshStatuses[rng.IntN(len(MeshStatuses))]
			resume := rng.IntN(4) == 0
			got, ok := AdvanceMeshStatus(cur, next, resume)
			if cur != "" {
				backwards := got.Order() < cur.Order() && !(cur == MeshPaused && got == MeshRunning)
				require.False(t, backwards, "%s -> %s", cur, got)
				if cur.Terminal() {
					require.Equal(t, cur, got)
					require.False(t, ok)
				}
				if cur == MeshPaused && got == MeshRunning {
					require.True(t, resume)
				}
			}
			if !ok {
				require.Equal(t, cur, got)
			}
			cur = got
		}
	}
}

// TestMeshFoldProperty: folding random mesh steps never lowers progress,
// never leaves a terminal status and counts every dropped update.
func TestMeshFoldProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	kinds := []string{MeshKindDispatch, MeshKindHop, MeshKindRetry, MeshKindPause, MeshKindResume, MeshKindCancel, MeshKindSink, MeshKindFailed}
	for range 2000 {
		var m MeshRow
		first := Event{Seq: 1, Nonce: "mesh:x", State: Received, Details: Details{Owner: OwnerMesh,
			Mesh: MeshStep{Kind: MeshKindCreated, ID: "x", Creator: "a@b", Status: MeshPending}.Encode()}}
		m.Apply(first)
		prevProgress, prevStatus, stale := m.Progress, m.Status, m.Stale
		for i := range rng.IntN(30) {
			st := MeshStep{Kind: kinds[rng.IntN(len(kinds))], Status: MeshStatuses[rng.IntN(len(MeshStatuses))],
				Progress: rng.Float64() * 100, Hop: rng.IntN(5)}
			m.Apply(Event{Seq: int64(i + 2), Nonce: "mesh:x", State: Queued, Details: Details{Mesh: st.Encode()}})
			require.GreaterOrEqual(t, m.Progress, prevProgress)
			if prevStatus.Terminal() {
				require.Equal(t, prevStatus, m.Status)
				require.Equal(t, prevProgress, m.Progress)
			}
			if m.Status == prevStatus && st.Status != prevStatus {
				require.Equal(t, stale+1, m.Stale, "a dropped update is counted")
			}
			prevProgress, prevStatus, stale = m.Progress, m.Status, m.Stale
		}
	}
}

// TestMeshFoldReceivedProgress: the relay's delivered event of a hop folds
// in the hop's received point (10 % of its share) and a processing step its
// processing point (15 %); a later, smaller point never lowers progress.
func TestMeshFoldReceivedProgress(t *testing.T) {
	t.Parallel()
	env := json.RawMessage(`{"id":"x","route":{"prev":["a@b"],"curr":"c@b","next":["d@b","e@b"]},"headers":{},"payload":{}}`)
	var m MeshRow
	m.Apply(Event{Seq: 1, Nonce: "mesh:x", State: Received, Details: Details{Owner: OwnerMesh,
		Mesh: MeshStep{Kind: MeshKindCreated, ID: "x", Creator: "a@b", Status: MeshPending, Envelope: env}.Encode()}})
	m.Apply(Event{Seq: 2, Nonce: "mesh:x", State: Dispatched, Details: Details{
		Mesh: MeshStep{Kind: MeshKindDispatch, Status: MeshRunning, Actor: "c@b", Attempt: 1}.Encode()}})
	require.Zero(t, m.Progress)
	// Four hops, one done: the second's share is 25 %.
	m.Apply(Event{Seq: 3, Nonce: "mesh:x", State: Delivered})
	require.InDelta(t, 27.5, m.Progress, 1e-9)
	m.Apply(Event{Seq: 4, Nonce: "mesh:x", State: Delivered, Details: Details{
		Mesh: MeshStep{Kind: MeshKindProcessing, Actor: "c@b", Attempt: 1, Progress: MeshHopProgress(env, MeshProcessingShare)}.Encode()}})
	require.InDelta(t, 28.75, m.Progress, 1e-9)
	require.Equal(t, MeshRunning, m.Status)
	m.Apply(Event{Seq: 5, Nonce: "mesh:x", State: Delivered})
	require.InDelta(t, 28.75, m.Progress, 1e-9, "a second delivered event lowers nothing")
}

// TestMeshProjectionEqualsRebuild: beam_mesh written by the appender equals
// the table Rebuild folds from the log, across a restart.
func TestMeshProjectionEqualsRebuild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	env := func(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"id":"e","payload":{"n":%d}}`, n)) }
	for i := range 30 {
		nonce := fmt.Sprintf("mesh:e%d", i)
		created := Event{Nonce: nonce, State: Received, From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
			IntentType: "mesh.envelope", Details: Details{Owner: OwnerMesh, Mesh: MeshStep{Kind: MeshKindCreated,
				ID: fmt.Sprintf("e%d", i), Creator: "alice@acme.beam.directory", Status: MeshPending, Envelope: env(0),
				DeadlineAt: 99}.Encode()}}
		q := Event{Nonce: nonce, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindWait}.Encode()}}
		b.append(created, q)
		b.append(Event{Nonce: nonce, State: Dispatched, Attempt: 1, Details: Details{Mesh: MeshStep{Kind: MeshKindDispatch,
			Status: MeshRunning, Actor: "bob@acme.beam.directory", Attempt: 1, FirstAttemptAt: 5}.Encode()}})
		b.append(ev(nonce, Delivered))
		switch i % 3 {
		case 0:
			b.append(Event{Nonce: nonce, State: Acked, Details: Details{Mesh: MeshStep{Kind: MeshKindSink,
				Status: MeshSucceeded, Progress: 100, Hop: 1, Envelope: env(1), Sink: true}.Encode()}})
		case 1:
			b.append(Event{Nonce: nonce, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindHop,
				Status: MeshRunning, Progress: 50, Hop: 1, Envelope: env(2), NextAt: 7}.Encode()}})
			b.append(Event{Nonce: nonce, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindPause, Status: MeshPaused}.Encode()}})
			b.append(Event{Nonce: nonce, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindHop, Status: MeshRunning}.Encode()}})
		case 2:
			b.append(Event{Nonce: nonce, State: DeadLetter, Details: Details{ErrorCode: "X", Mesh: MeshStep{Kind: MeshKindFailed,
				Status: MeshFailed, Reason: "MaxRetriesExhausted", Sink: true, Sump: true}.Encode()}})
		}
	}
	before, err := b.log.MeshRows(ctx)
	require.NoError(t, err)
	require.Len(t, before, 30)
	paused, ok, err := b.log.MeshEnvelope(ctx, "e1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, MeshPaused, paused.Status)
	require.Equal(t, 1, paused.Stale, "running without a resume is dropped while paused")
	require.JSONEq(t, string(env(2)), string(paused.Envelope))
	b.reopen()
	// Open envelopes cached at Open keep folding into beam_mesh.
	b.append(Event{Nonce: "mesh:e1", State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindResume, Status: MeshRunning}.Encode()}})
	resumed, _, err := b.log.MeshEnvelope(ctx, "e1")
	require.NoError(t, err)
	require.Equal(t, MeshRunning, resumed.Status)
	before, err = b.log.MeshRows(ctx)
	require.NoError(t, err)
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	after, err := b.log.MeshRows(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after)

	dead, total, err := b.log.MeshEnvelopes(ctx, MeshQuery{Sump: true, Limit: 5})
	require.NoError(t, err)
	require.EqualValues(t, 10, total)
	require.Len(t, dead, 5)
	open, err := b.log.MeshOpen(ctx, true, 10, 0)
	require.NoError(t, err)
	require.Len(t, open, 1, "only the resumed one is due; the paused ones are not")
	require.Equal(t, "e1", open[0].ID)
}
