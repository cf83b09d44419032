package tracing

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// meshFromSQL reads envelope id's row from SQLite, bypassing meshLive.
func meshFromSQL(t *testing.T, l *Log, id string) (MeshRow, bool) {
	t.Helper()
	var m MeshRow
	err := scanMesh(l.reads.meshByID.QueryRowContext(context.Background(), id), &m)
	if errors.Is(err, sql.ErrNoRows) {
		return m, false
	}
	require.NoError(t, err)
	return m, true
}

// TestMeshEnvelopeFromMemoryEqualsSQL: MeshEnvelope answers open and
// recently finished envelopes from memory, and what it answers is always
// the committed row, the one beam_mesh holds once the rows held behind the
// log are written: after every step, after a refused append, past the
// bound of finished rows kept (then from SQLite, after the read barrier),
// and after a rebuild.
func TestMeshEnvelopeFromMemoryEqualsSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	check := func(id string, inMemory bool) {
		t.Helper()
		_, cached := b.log.meshLive.get(id)
		require.Equal(t, inMemory, cached, id)
		got, ok, err := b.log.MeshEnvelope(ctx, id)
		require.NoError(t, err)
		require.True(t, ok, id)
		require.NoError(t, b.log.Sync(ctx))
		want, ok := meshFromSQL(t, b.log, id)
		require.True(t, ok, id)
		require.Equal(t, want, got, id)
	}
	env := func(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"id":"e","payload":{"n":%d}}`, n)) }
	start := func(id string) string {
		nonce := "mesh:" + id
		b.append(Event{Nonce: nonce, State: Received, From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
			IntentType: "mesh.envelope", Details: Details{Owner: OwnerMesh, Mesh: MeshStep{Kind: MeshKindCreated,
				ID: id, Creator: "alice@acme.beam.directory", Status: MeshPending, Envelope: env(0)}.Encode()}},
			Event{Nonce: nonce, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindWait}.Encode()}})
		return nonce
	}
	finish := func(nonce string) {
		b.append(Event{Nonce: nonce, State: Dispatched, Attempt: 1, Details: Details{Mesh: MeshStep{Kind: MeshKindDispatch,
			Status: MeshRunning, Actor: "bob@acme.beam.directory", Attempt: 1}.Encode()}},
			ev(nonce, Delivered), Event{Nonce: nonce, State: Acked, Details: Details{Mesh: MeshStep{Kind: MeshKindSink,
				Status: MeshSucceeded, Progress: 100, Hop: 1, Envelope: env(1), Sink: true}.Encode()}})
	}

	n := start("a")
	check("a", true)
	b.append(Event{Nonce: n, State: Dispatched, Attempt: 1, Details: Details{Mesh: MeshStep{Kind: MeshKindDispatch,
		Status: MeshRunning, Actor: "bob@acme.beam.directory", Attempt: 1}.Encode()}})
	check("a", true)
	// A refused append changes nothing.
	_, err := b.log.Append(ctx, Event{Nonce: n, State: Received})
	require.Error(t, err)
	check("a", true)
	b.append(ev(n, Delivered), Event{Nonce: n, State: Acked, Details: Details{Mesh: MeshStep{Kind: MeshKindSink,
		Status: MeshSucceeded, Progress: 100, Hop: 1, Envelope: env(1), Sink: true}.Encode()}})
	check("a", true)
	got, _, err := b.log.MeshEnvelope(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, MeshSucceeded, got.Status)

	// Finished rows beyond the bound are read from SQLite again.
	for i := range meshDoneMax {
		finish(start(fmt.Sprintf("f%d", i)))
	}
	check("a", false)
	check("f0", true)
	check(fmt.Sprintf("f%d", meshDoneMax-1), true)

	open := start("o")
	check("o", true)
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	check("o", false)
	b.append(Event{Nonce: open, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindPause, Status: MeshPaused}.Encode()}})
	check("o", true)
	got, _, err = b.log.MeshEnvelope(ctx, "o")
	require.NoError(t, err)
	require.Equal(t, MeshPaused, got.Status)
}

// meshSteps appends the steps of envelope id one commit at a time (created,
// then hops dispatched and done, then the sink) and returns the row
// MeshEnvelope answered after each commit.
func meshSteps(b *testBundle, id string, hops int) []MeshRow {
	b.t.Helper()
	ctx := context.Background()
	nonce := "mesh:" + id
	step := func(state State, st MeshStep) Event {
		return Event{Nonce: nonce, State: state, Attempt: st.Attempt, Details: Details{Mesh: st.Encode()}}
	}
	created := step(Received, MeshStep{Kind: MeshKindCreated, ID: id, Creator: "alice@acme.beam.directory",
		Status: MeshPending, Envelope: json.RawMessage(`{"id":"` + id + `"}`)})
	created.From, created.To, created.IntentType = "alice@acme.beam.directory", "bob@acme.beam.directory", "mesh.envelope"
	created.Details.Owner = OwnerMesh
	commits := [][]Event{{created}, {step(Queued, MeshStep{Kind: MeshKindWait})}}
	for i := range hops {
		commits = append(commits, []Event{step(Dispatched, MeshStep{Kind: MeshKindDispatch, Status: MeshRunning,
			Actor: fmt.Sprintf("a%d@acme.beam.directory", i), Attempt: 1})})
		if i < hops-1 {
			commits = append(commits, []Event{step(Queued, MeshStep{Kind: MeshKindHop, Hop: i + 1,
				Progress: float64(i+1) * 100 / float64(hops), Envelope: json.RawMessage(fmt.Sprintf(`{"id":%q,"payload":%d}`, id, i))})})
		}
	}
	commits = append(commits, []Event{ev(nonce, Delivered), step(Acked, MeshStep{Kind: MeshKindSink,
		Status: MeshSucceeded, Hop: hops, Progress: 100, Sink: true})})
	rows := make([]MeshRow, 0, len(commits))
	for _, c := range commits {
		b.append(c...)
		row, ok, err := b.log.MeshEnvelope(ctx, id)
		require.NoError(b.t, err)
		require.True(b.t, ok, id)
		rows = append(rows, row)
	}
	return rows
}

// TestMeshRowFoldedToItsTrace: a row read before later commits of its
// envelope (what a reader holds when the envelope moves between its read
// of the row and its read of the trace) folded with the trace's later
// events is the row after them: equal to what MeshEnvelope answers then,
// to beam_mesh once the rows held behind the log are written, and to a
// rebuild. MeshEnvelopeTrace answers that row with the trace.
func TestMeshRowFoldedToItsTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	rows := meshSteps(b, "fold", 4)
	last := rows[len(rows)-1]
	require.Equal(t, MeshSucceeded, last.Status)

	row, trace, ok, err := b.log.MeshEnvelopeTrace(ctx, "fold")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, last, row)
	require.Equal(t, trace[len(trace)-1].Seq, row.LastSeq)
	for i, old := range rows {
		require.Equal(t, last, meshAt(old, trace), "row read after commit %d", i)
	}
	require.Less(t, projSeqOnDisk(t, b.log.ReadDB()), b.log.LastSeq(), "the rows are still held behind the log")
	require.NoError(t, b.log.Sync(ctx))
	onDisk, ok := meshFromSQL(t, b.log, "fold")
	require.True(t, ok)
	require.Equal(t, last, onDisk)
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	rebuilt, _, _, err := b.log.MeshEnvelopeTrace(ctx, "fold")
	require.NoError(t, err)
	require.Equal(t, last, rebuilt)

	_, _, ok, err = b.log.MeshEnvelopeTrace(ctx, "none")
	require.NoError(t, err)
	require.False(t, ok)
}

// TestMeshEnvelopeBeyondMemoryWhileHeldBehind: with more open envelopes
// than meshLive holds and every row still held behind the log, an envelope
// not in memory is read from beam_mesh after the read barrier and is the
// fold of its events, as is every later step of it; the list reads agree.
func TestMeshEnvelopeBeyondMemoryWhileHeldBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	created := func(id string) []Event {
		nonce := "mesh:" + id
		c := Event{Nonce: nonce, State: Received, From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
			IntentType: "mesh.envelope", Details: Details{Owner: OwnerMesh, Mesh: MeshStep{Kind: MeshKindCreated, ID: id,
				Creator: "alice@acme.beam.directory", Status: MeshPending}.Encode()}}
		return []Event{c, {Nonce: nonce, State: Queued, Details: Details{Mesh: MeshStep{Kind: MeshKindWait}.Encode()}}}
	}
	var batch []Event
	for i := range meshLiveMax {
		batch = append(batch, created(fmt.Sprintf("full-%05d", i))...)
		if len(batch) >= 1024 {
			b.append(batch...)
			batch = batch[:0]
		}
	}
	b.append(batch...)
	require.NoError(t, b.log.Sync(ctx))

	b.log.meshLive.mu.RLock()
	held := len(b.log.meshLive.rows)
	b.log.meshLive.mu.RUnlock()
	require.Equal(t, meshLiveMax, held, "meshLive is full of open envelopes")

	// Until it finishes, "outside" is not held in memory.
	rows := meshSteps(b, "outside", 3)
	for i := 1; i < len(rows); i++ {
		require.Greater(t, rows[i].LastSeq, rows[i-1].LastSeq, "step %d read an older row", i)
	}
	last := rows[len(rows)-1]
	require.Equal(t, MeshSucceeded, last.Status)
	require.Equal(t, 100.0, last.Progress)
	row, trace, ok, err := b.log.MeshEnvelopeTrace(ctx, "outside")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, last, row)
	require.Equal(t, last, meshAt(MeshRow{}, trace), "the row is the fold of its trace")
	list, total, err := b.log.MeshEnvelopes(ctx, MeshQuery{Statuses: []MeshStatus{MeshSucceeded}})
	require.NoError(t, err)
	require.EqualValues(t, 1, total)
	require.Equal(t, []MeshRow{last}, list)
}
