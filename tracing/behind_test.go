package tracing

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// holdRows keeps projection rows in memory until something else makes the
// writer write them.
func holdRows(c *Config) { c.ProjectAfter = time.Hour }

// storedIntent reads nonce's intent_log row as it is on disk, bypassing the
// log's read methods.
func storedIntent(t *testing.T, l *Log, nonce string) (string, bool) {
	t.Helper()
	var status string
	err := l.ReadDB().Get(&status, `SELECT status FROM intent_log WHERE nonce = ?`, nonce)
	if err == sql.ErrNoRows {
		return "", false
	}
	require.NoError(t, err)
	return status, true
}

func projSeqOnDisk(t *testing.T, db *sqlx.DB) int64 {
	t.Helper()
	var seq int64
	require.NoError(t, db.Get(&seq, selectProjSeq))
	return seq
}

func busReceived(nonce, id string) Event {
	ev := received(nonce)
	ev.Details = Details{Owner: OwnerBus, Bus: &BusMessage{MessageID: id}}
	return ev
}

// TestReadsSeeRowsNotWrittenYet: an ordinary commit writes only events; the
// rows wait in memory, and every read method sees them anyway.
func TestReadsSeeRowsNotWrittenYet(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	_, err := b.log.Append(ctx, received("wb-1"), busReceived("wb-m", "msg-1"))
	require.NoError(t, err)
	_, err = b.log.Append(ctx, Event{Nonce: "wb-1", State: Validated}, Event{Nonce: "wb-m", State: Validated})
	require.NoError(t, err)

	_, onDisk := storedIntent(t, b.log, "wb-1")
	require.False(t, onDisk, "the commit wrote the projection row with the events")
	require.Equal(t, 2.0, b.metric("beam_log_projection_pending_rows"))
	require.Less(t, projSeqOnDisk(t, b.log.ReadDB()), b.log.LastSeq())

	st, ok, err := b.log.State(ctx, "wb-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Validated, st)
	row, ok, err := b.log.Intent(ctx, "wb-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(3), row.LastSeq)
	has, err := b.log.HasNonce(ctx, "wb-m")
	require.NoError(t, err)
	require.True(t, has)
	ms, ok, err := b.log.MessageState(ctx, "wb-m")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Validated, ms.Status)
	n, ok, err := b.log.MessageNonce(ctx, "msg-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "wb-m", n)
	m, ok, err := b.log.MessageByID(ctx, "msg-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "wb-m", m.Nonce)
	d, err := b.log.FirstDetails(ctx, "wb-m")
	require.NoError(t, err)
	require.Equal(t, "msg-1", d.Bus.MessageID)
	tr, err := b.log.Trace(ctx, "wb-1")
	require.NoError(t, err)
	require.Len(t, tr, 2)
	byNonce, err := b.log.IntentsByNonce(ctx, []string{"wb-1", "none"})
	require.NoError(t, err)
	require.Len(t, byNonce, 1)
	require.Equal(t, Validated, byNonce[0].Status)
	_, onDisk = storedIntent(t, b.log, "wb-1")
	require.False(t, onDisk, "IntentsByNonce answers from memory")

	// A message id held only in memory is still taken.
	_, err = b.log.Append(ctx, busReceived("wb-m2", "msg-1"))
	var verr *ValidationError
	require.ErrorAs(t, err, &verr)

	// A list query writes what is pending first.
	rows, err := b.log.Intents(ctx, IntentQuery{Statuses: []State{Validated}})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	status, onDisk := storedIntent(t, b.log, "wb-1")
	require.True(t, onDisk)
	require.Equal(t, string(Validated), status)
	require.Equal(t, b.log.LastSeq(), projSeqOnDisk(t, b.log.ReadDB()))
	require.Equal(t, 0.0, b.metric("beam_log_projection_pending_rows"))
}

// TestDoSeesRowsNotWrittenYet: a Do function reads the rows of earlier
// commits whose rows were held in memory.
func TestDoSeesRowsNotWrittenYet(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	_, err := b.log.Append(ctx, received("do-1"))
	require.NoError(t, err)
	_, onDisk := storedIntent(t, b.log, "do-1")
	require.False(t, onDisk)
	var status string
	_, err = b.log.Do(ctx, func(tx *sqlx.Tx) error {
		return tx.Get(&status, `SELECT status FROM intent_log WHERE nonce = ?`, "do-1")
	}, Event{Nonce: "do-2", State: Received, From: "a@x", To: "b@x", IntentType: "t"})
	require.NoError(t, err)
	require.Equal(t, string(Received), status)
}

// crashImage copies the log's committed state, as a SIGKILL would leave it
// (events durable, the rows written behind them not yet), to a new file.
func crashImage(t *testing.T, l *Log) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "crash.db")
	db, err := sql.Open("sqlite", l.cfg.Path)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`VACUUM INTO ?`, dst)
	require.NoError(t, err)
	return dst
}

// TestOpenFoldsEventsAfterTheProjectionMark: a log that stopped with rows
// not written has them, exactly, after the next Open, equal to a rebuild.
func TestOpenFoldsEventsAfterTheProjectionMark(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	for i := range 40 {
		n := fmt.Sprintf("cr-%02d", i)
		first := received(n)
		if i%4 == 0 {
			first = busReceived(n, "id-"+n)
		}
		_, err := b.log.Append(ctx, first)
		require.NoError(t, err)
		if i == 20 {
			// Half of the rows reach the disk; the later events of those
			// nonces must be folded onto them.
			require.NoError(t, b.log.Sync(ctx))
		}
	}
	for i := range 40 {
		n := fmt.Sprintf("cr-%02d", i)
		steps := []State{Validated, Dispatched, Delivered, Acked}[:i%5]
		for _, s := range steps {
			_, err := b.log.Append(ctx, Event{Nonce: n, State: s})
			require.NoError(t, err)
		}
	}
	path := crashImage(t, b.log)
	want, err := b.log.Snapshot(ctx) // writes the pending rows of the live log first
	require.NoError(t, err)

	img, err := sqlx.Open("sqlite", path)
	require.NoError(t, err)
	mark := projSeqOnDisk(t, img)
	require.NoError(t, img.Close())
	require.Less(t, mark, b.log.LastSeq(), "the image must hold events after the mark")

	got, rebuilt := openedAndRebuilt(t, path, (*Log).Snapshot)
	require.Equal(t, want, got)
	require.Equal(t, want, rebuilt)
}

// openedAndRebuilt opens the log at path (which folds the events after the
// projections' mark), reads it, rebuilds the projections from the log and
// reads it again.
func openedAndRebuilt[T any](t *testing.T, path string, read func(*Log, context.Context) (T, error)) (opened, rebuilt T) {
	t.Helper()
	ctx := context.Background()
	l, err := Open(ctx, Config{Path: path})
	require.NoError(t, err)
	defer l.Close()
	opened, err = read(l, ctx)
	require.NoError(t, err)
	require.Equal(t, l.LastSeq(), projSeqOnDisk(t, l.ReadDB()))
	_, err = l.Rebuild(ctx)
	require.NoError(t, err)
	rebuilt, err = read(l, ctx)
	require.NoError(t, err)
	return opened, rebuilt
}

// TestCloseWritesPendingRows: Close leaves no row behind.
func TestCloseWritesPendingRows(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	_, err := b.log.Append(ctx, received("cl-1"))
	require.NoError(t, err)
	b.reopen(holdRows)
	require.Equal(t, b.log.LastSeq(), projSeqOnDisk(t, b.log.ReadDB()))
	status, onDisk := storedIntent(t, b.log, "cl-1")
	require.True(t, onDisk)
	require.Equal(t, string(Received), status)
}

// TestIdleWriterWritesDueRows: rows are written once due even when no other
// request comes.
func TestIdleWriterWritesDueRows(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.ProjectAfter = 10 * time.Millisecond })
	_, err := b.log.Append(context.Background(), received("idle-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, onDisk := storedIntent(t, b.log, "idle-1")
		return onDisk
	}, 10*time.Second, 5*time.Millisecond)
}

// TestMeshRowsWrittenBehind: a commit that changes a pipeline envelope
// writes only its events; MeshEnvelope answers from memory, the list and
// scheduler reads write the pending rows first, and a log that stopped with
// beam_mesh rows not written has them after the next Open, equal to a
// rebuild.
func TestMeshRowsWrittenBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	step := func(nonce string, state State, st MeshStep) Event {
		return Event{Nonce: nonce, State: state, Attempt: st.Attempt, Details: Details{Mesh: st.Encode()}}
	}
	for i := range 6 {
		id := fmt.Sprintf("mb-%d", i)
		nonce := "mesh:" + id
		created := step(nonce, Received, MeshStep{Kind: MeshKindCreated, ID: id, Creator: "alice@acme.beam.directory",
			Status: MeshPending, Envelope: []byte(`{"id":"` + id + `"}`)})
		created.From, created.To, created.IntentType = "alice@acme.beam.directory", "bob@acme.beam.directory", "mesh.envelope"
		created.Details.Owner = OwnerMesh
		b.append(created, step(nonce, Queued, MeshStep{Kind: MeshKindWait}))
		if i%2 == 0 {
			b.append(step(nonce, Dispatched, MeshStep{Kind: MeshKindDispatch, Status: MeshRunning, Attempt: 1,
				Actor: "bob@acme.beam.directory"}))
		}
		if i%4 == 0 {
			b.append(ev(nonce, Delivered), step(nonce, Acked, MeshStep{Kind: MeshKindSink, Status: MeshSucceeded,
				Progress: 100, Hop: 1, Sink: true, Envelope: []byte(`{"id":"` + id + `","payload":1}`)}))
		}
	}
	var onDisk int
	require.NoError(t, b.log.ReadDB().Get(&onDisk, `SELECT COUNT(*) FROM beam_mesh`))
	require.Zero(t, onDisk, "a commit wrote beam_mesh rows with its events")
	row, ok, err := b.log.MeshEnvelope(ctx, "mb-0")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, MeshSucceeded, row.Status)
	require.Less(t, projSeqOnDisk(t, b.log.ReadDB()), b.log.LastSeq(), "MeshEnvelope answered from memory")

	path := crashImage(t, b.log)
	due, err := b.log.MeshOpen(ctx, true, 0, 10)
	require.NoError(t, err)
	require.Len(t, due, 3, "mb-1, mb-3 and mb-5 wait to be dispatched")
	require.Equal(t, b.log.LastSeq(), projSeqOnDisk(t, b.log.ReadDB()))
	want, err := b.log.MeshRows(ctx)
	require.NoError(t, err)
	require.Len(t, want, 6)

	got, rebuilt := openedAndRebuilt(t, path, (*Log).MeshRows)
	require.Equal(t, want, got)
	require.Equal(t, want, rebuilt)
}

// dueCommit makes the idle writer write the rows that are due, as the
// ProjectAfter timer does, and waits until that commit is done.
func (b *testBundle) dueCommit() {
	b.t.Helper()
	commits := b.metric("beam_log_commit_seconds")
	b.log.qmu.Lock()
	b.log.projectDue = true
	b.log.qcond.Signal()
	b.log.qmu.Unlock()
	require.Eventually(b.t, func() bool { return b.metric("beam_log_commit_seconds") > commits },
		10*time.Second, time.Millisecond)
}

// TestDueRowsOfOpenIntentsWaitOnce: when rows are due, a finished intent's
// row is written (once, in its final state) while an open intent's row waits
// for the next due commit, and is written then even if the intent is still
// open. The mark stays before the held row's events, so a restart in
// between folds them again and the projections equal a rebuild.
func TestDueRowsOfOpenIntentsWaitOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, holdRows)
	ctx := context.Background()
	b.append(received("h-done"))
	b.append(busReceived("h-open", "msg-open"))
	for _, s := range []State{Validated, Dispatched, Delivered, Acked} {
		b.append(ev("h-done", s))
	}
	b.append(ev("h-open", Validated))

	b.dueCommit()
	status, onDisk := storedIntent(t, b.log, "h-done")
	require.True(t, onDisk)
	require.Equal(t, string(Acked), status)
	_, onDisk = storedIntent(t, b.log, "h-open")
	require.False(t, onDisk, "the open intent's row was written while it was open")
	require.Equal(t, 1.0, b.metric("beam_log_projection_pending_rows"))
	require.Equal(t, int64(1), projSeqOnDisk(t, b.log.ReadDB()), "the mark must stay before h-open's first event")
	require.Equal(t, 1.0, b.metric("beam_log_projection_rows_written_total", "how", "insert"))
	st, ok, err := b.log.State(ctx, "h-open")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Validated, st)
	_, err = b.log.Append(ctx, busReceived("h-dup", "msg-open"))
	var verr *ValidationError
	require.ErrorAs(t, err, &verr, "the held message's id must stay taken")

	// A crash now: Open folds the held row's events from the mark on.
	path := crashImage(t, b.log)
	img, err := Open(ctx, Config{Path: path})
	require.NoError(t, err)
	defer img.Close()
	require.Equal(t, img.LastSeq(), projSeqOnDisk(t, img.ReadDB()))
	folded, err := img.Snapshot(ctx)
	require.NoError(t, err)
	_, err = img.Rebuild(ctx)
	require.NoError(t, err)
	rebuilt, err := img.Snapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, rebuilt, folded)

	// The next due commit writes the held row, still open, and a row that
	// became pending since waits in its turn.
	b.append(ev("h-open", Dispatched))
	b.append(received("h-new"))
	b.dueCommit()
	status, onDisk = storedIntent(t, b.log, "h-open")
	require.True(t, onDisk)
	require.Equal(t, string(Dispatched), status)
	_, onDisk = storedIntent(t, b.log, "h-new")
	require.False(t, onDisk)
	require.Equal(t, b.log.LastSeq()-1, projSeqOnDisk(t, b.log.ReadDB()))
	b.dueCommit()
	_, onDisk = storedIntent(t, b.log, "h-new")
	require.True(t, onDisk, "a row waits for one due commit, not two")
	require.Equal(t, b.log.LastSeq(), projSeqOnDisk(t, b.log.ReadDB()))
	require.Equal(t, 0.0, b.metric("beam_log_projection_pending_rows"))
	require.Equal(t, 3.0, b.metric("beam_log_projection_rows_written_total", "how", "insert"))
	require.Equal(t, 0.0, b.metric("beam_log_projection_rows_written_total", "how", "update"))

	// A read barrier writes held rows too.
	b.append(ev("h-open", Delivered))
	b.append(received("h-last"))
	b.dueCommit()
	_, onDisk = storedIntent(t, b.log, "h-last")
	require.False(t, onDisk)
	require.NoError(t, b.log.Sync(ctx))
	_, onDisk = storedIntent(t, b.log, "h-last")
	require.True(t, onDisk)
	require.Equal(t, b.log.LastSeq(), projSeqOnDisk(t, b.log.ReadDB()))
	require.Equal(t, 1.0, b.metric("beam_log_projection_rows_written_total", "how", "update"))
}
