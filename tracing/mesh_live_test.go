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
