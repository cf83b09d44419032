package tracing

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// Events after the first leave from, to, intentType and transport empty;
// the writer binds them as NULL and the insert stores the empty string. They must
// hold text, never NULL, or every reader that scans them into a string
// would fail.
func TestEmptyEventFieldsStoredAsEmptyText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.log.Append(ctx, received("n1"), ev("n1", Validated), Event{Nonce: "n1", State: Dispatched, Transport: "ws"})
	require.NoError(t, err)

	var rows []struct {
		From, To, Type, Transport string
	}
	require.NoError(t, b.log.ReadDB().SelectContext(ctx, &rows, `SELECT from_beam_id AS "from", to_beam_id AS "to",
		intent_type AS "type", transport FROM intent_trace_events ORDER BY seq`))
	require.Len(t, rows, 3)
	require.Equal(t, "alice@acme.beam.directory", rows[0].From)
	require.Equal(t, "ws", rows[0].Transport)
	require.Equal(t, struct{ From, To, Type, Transport string }{}, rows[1])
	require.Equal(t, "ws", rows[2].Transport)
	require.Empty(t, rows[2].From)

	var nonText int
	require.NoError(t, b.log.ReadDB().GetContext(ctx, &nonText, `SELECT COUNT(*) FROM intent_trace_events
		WHERE typeof(from_beam_id) != 'text' OR typeof(to_beam_id) != 'text'
		   OR typeof(intent_type) != 'text' OR typeof(transport) != 'text'`))
	require.Zero(t, nonText)

	trace, err := b.log.Trace(ctx, "n1")
	require.NoError(t, err)
	require.Len(t, trace, 3)
	require.Empty(t, trace[1].From)
	require.Empty(t, trace[1].Transport)
}

// A batch whose transaction SQLite rolls back by itself in the middle of
// an insert (as a failing INSERT OR ROLLBACK does) fails the requests of
// that batch only: nothing of it is written, the log reports the write
// error until a later batch commits, and the next append commits normally
// with the seqs the failed batch gave back.
func TestBatchRolledBackInsideSQLiteFailsOnlyThatBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.log.Append(ctx, received("before"))
	require.NoError(t, err)
	// A temporary trigger on the write connection rolls the whole
	// transaction back when the poisoned nonce is inserted.
	_, err = b.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`CREATE TEMP TRIGGER poison BEFORE INSERT ON main.intent_trace_events
			WHEN NEW.nonce = 'poison' BEGIN SELECT RAISE(ROLLBACK, 'poisoned event'); END`)
		return err
	})
	require.NoError(t, err)

	_, err = b.log.Append(ctx, received("poison"))
	require.ErrorContains(t, err, "poisoned event")
	require.Error(t, b.log.WriteErr())
	_, ok, err := b.log.State(ctx, "poison")
	require.NoError(t, err)
	require.False(t, ok)

	evs, err := b.log.Append(ctx, received("after"), ev("before", Validated))
	require.NoError(t, err)
	require.Equal(t, int64(2), evs[0].Seq, "the failed batch gives its seq back")
	require.NoError(t, b.log.WriteErr())
	st, ok, err := b.log.State(ctx, "before")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Validated, st)

	// The projections still equal a rebuild.
	before := snapshotProjections(t, b.log)
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, before, snapshotProjections(t, b.log))
}

// A COMMIT that fails leaves SQLite's transaction open (a deferred foreign
// key still violated at commit). The write connection ends it, so only that
// batch fails and the next one commits.
func TestBatchWhoseCommitFailsFailsOnlyThatBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	deferredForeignKey(t, b, "")

	_, err := b.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`INSERT INTO temp.child VALUES (1)`)
		return err
	}, received("doomed"))
	require.ErrorContains(t, err, "FOREIGN KEY")
	_, ok, err := b.log.State(ctx, "doomed")
	require.NoError(t, err)
	require.False(t, ok)

	evs, err := b.log.Append(ctx, received("after"))
	require.NoError(t, err, "the connection is out of the failed transaction")
	require.Equal(t, int64(1), evs[0].Seq, "the failed batch gives its seq back")
	var children int
	require.NoError(t, b.log.wdb.GetContext(ctx, &children, `SELECT count(*) FROM temp.child`))
	require.Zero(t, children, "the failed batch's writes were rolled back")
}

// The event insert leaves seq to SQLite (the next rowid), which is the seq
// the writer gave the event only while the table ends where the log does. A
// row the writer did not put there (here through a Do function) must make
// the next batch fail, not shift its events to other seqs than the ones
// Append reports.
func TestEventRowsOutOfStepWithTheLogFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs, err := b.log.Append(ctx, received("n1"), ev("n1", Validated))
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, []int64{evs[0].Seq, evs[1].Seq})
	var rowids []int64
	require.NoError(t, b.log.ReadDB().SelectContext(ctx, &rowids, `SELECT rowid FROM intent_trace_events ORDER BY rowid`))
	require.Equal(t, []int64{1, 2}, rowids)

	_, err = b.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`INSERT INTO intent_trace_events(seq, nonce, state, at) VALUES (3, 'stray', 'received', 1)`)
		return err
	})
	require.NoError(t, err)

	_, err = b.log.Append(ctx, received("n2"), ev("n2", Validated))
	require.ErrorContains(t, err, "out of step")
	var n int
	require.NoError(t, b.log.ReadDB().GetContext(ctx, &n, `SELECT COUNT(*) FROM intent_trace_events WHERE nonce = 'n2'`))
	require.Zero(t, n)
}

// When an Append's COMMIT fails (here a deferred foreign key that a trigger
// on the event insert breaks), the batch fails alone and the connection is
// out of the transaction for the next one.
func TestAppendWhoseCommitFailsFailsOnlyThatBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	deferredForeignKey(t, b, `CREATE TEMP TRIGGER doom AFTER INSERT ON main.intent_trace_events
		WHEN NEW.nonce = 'doomed' BEGIN INSERT INTO child VALUES (1); END`)

	_, err := b.log.Append(ctx, received("doomed"))
	require.ErrorContains(t, err, "FOREIGN KEY")
	_, ok, err := b.log.State(ctx, "doomed")
	require.NoError(t, err)
	require.False(t, ok)

	evs, err := b.log.Append(ctx, received("after"), ev("after", Validated))
	require.NoError(t, err, "the connection is out of the failed transaction")
	require.Equal(t, int64(1), evs[0].Seq, "the failed batch gives its seq back")
	var children, events int
	require.NoError(t, b.log.wdb.GetContext(ctx, &children, `SELECT count(*) FROM temp.child`))
	require.Zero(t, children, "the failed batch's writes were rolled back")
	require.NoError(t, b.log.ReadDB().GetContext(ctx, &events, `SELECT count(*) FROM intent_trace_events`))
	require.Equal(t, 2, events)
}

// deferredForeignKey turns foreign keys on for the write connection and
// creates temp.parent and temp.child, whose reference to it is checked at
// COMMIT, and then runs extra; a row in child makes the transaction's
// COMMIT fail.
func deferredForeignKey(t *testing.T, b *testBundle, extra string) {
	t.Helper()
	ctx := context.Background()
	_, err := b.log.wdb.ExecContext(ctx, `PRAGMA foreign_keys = ON`)
	require.NoError(t, err)
	_, err = b.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`CREATE TEMP TABLE parent(id INTEGER PRIMARY KEY);
			CREATE TEMP TABLE child(p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);` + extra)
		return err
	})
	require.NoError(t, err)
}
