package tracing

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// schemaV1 is the version 1 layout: no first_seq, events indexed by
// (nonce, seq), intent_log keyed by nonce.
const schemaV1 = `
CREATE TABLE intent_trace_events(
  seq INTEGER PRIMARY KEY, nonce TEXT NOT NULL, state TEXT NOT NULL, at INTEGER NOT NULL,
  from_beam_id TEXT NOT NULL DEFAULT '', to_beam_id TEXT NOT NULL DEFAULT '', intent_type TEXT NOT NULL DEFAULT '',
  transport TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 0, details TEXT NOT NULL DEFAULT '{}');
CREATE INDEX intent_trace_events_nonce_seq ON intent_trace_events(nonce, seq);
CREATE TABLE intent_log(
  nonce TEXT PRIMARY KEY, from_beam_id TEXT NOT NULL DEFAULT '', to_beam_id TEXT NOT NULL DEFAULT '',
  intent_type TEXT NOT NULL DEFAULT '', owner TEXT NOT NULL DEFAULT 'directory', status TEXT NOT NULL,
  requested_at INTEGER NOT NULL, client_timestamp TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 0,
  transport TEXT NOT NULL DEFAULT '', timeout_ms INTEGER NOT NULL DEFAULT 0, error_code TEXT NOT NULL DEFAULT '',
  completed_at INTEGER, round_trip_latency_ms INTEGER, result_json TEXT, updated_at INTEGER NOT NULL,
  last_seq INTEGER NOT NULL);
INSERT INTO intent_trace_events(seq, nonce, state, at, from_beam_id, to_beam_id, intent_type, transport, attempt, details) VALUES
  (1, 'a', 'received', 1000, 'x@d.beam.directory', 'y@d.beam.directory', 'task.run', 'ws', 0, '{"owner":"directory","clientTimestamp":"2026-01-01T00:00:00Z"}'),
  (2, 'b', 'received', 2000, 'x@d.beam.directory', 'y@d.beam.directory', 'task.run', 'bus', 0, '{"owner":"bus","bus":{"messageId":"m-b","payload":{"k":1}}}'),
  (3, 'a', 'dispatched', 3000, '', '', '', 'ws', 1, '{"timeoutMs":30000}'),
  (4, 'b', 'queued', 4000, '', '', '', '', 0, '{"nextRetryAt":9000,"retryCount":1}'),
  (5, 'a', 'delivered', 5000, '', '', '', '', 0, '{}'),
  (6, 'a', 'acked', 6000, '', '', '', '', 0, '{"result":{"ok":true},"peer":"p"}');
INSERT INTO intent_log(nonce, status, requested_at, updated_at, last_seq) VALUES ('stale', 'received', 1, 1, 1);
PRAGMA user_version = 1;
`

func TestMigrateV1(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "beam.db")
	db, err := sqlx.Open("sqlite", path)
	require.NoError(t, err)
	_, err = db.Exec(schemaV1)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	b := &testBundle{t: t, path: path}
	b.open()
	t.Cleanup(func() { _ = b.log.Close() })
	ctx := context.Background()

	var version int
	require.NoError(t, b.log.ReadDB().Get(&version, `PRAGMA user_version`))
	require.Equal(t, schemaVersion, version)
	var firsts []int64
	require.NoError(t, b.log.ReadDB().Select(&firsts, `SELECT first_seq FROM intent_trace_events ORDER BY seq`))
	require.Equal(t, []int64{1, 2, 1, 2, 1, 1}, firsts)

	tr, err := b.log.Trace(ctx, "a")
	require.NoError(t, err)
	require.Len(t, tr, 4)
	require.Equal(t, []int64{1, 3, 5, 6}, []int64{tr[0].Seq, tr[1].Seq, tr[2].Seq, tr[3].Seq})
	require.Equal(t, "p", tr[3].Details.Extra["peer"])

	row, ok, err := b.log.Intent(ctx, "a")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Acked, row.Status)
	require.Equal(t, int64(1), row.FirstSeq)
	require.Equal(t, int64(6), row.LastSeq)
	_, ok, err = b.log.Intent(ctx, "stale") // the old projection is gone
	require.NoError(t, err)
	require.False(t, ok)
	m, ok, err := b.log.Message(ctx, "b")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Queued, m.Status)
	require.Equal(t, "m-b", m.ID)

	// The migrated log keeps working and stays equal to a rebuild.
	b.append(ev("b", Dispatched))
	b.append(received("c"))
	tr, err = b.log.Trace(ctx, "c")
	require.NoError(t, err)
	require.Len(t, tr, 1)
	require.Equal(t, int64(8), tr[0].Seq)
	before := snapshotProjections(t, b.log)
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, before, snapshotProjections(t, b.log))
	b.reopen()
	require.Equal(t, before, snapshotProjections(t, b.log))
}

// TestRebuildRepairsFirstSeq shows that Rebuild puts back a damaged
// intent_trace_events.first_seq, which Trace depends on.
func TestRebuildRepairsFirstSeq(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.append(received("a"), received("b"), ev("a", Validated), ev("b", Failed), ev("a", Dispatched))
	_, err := b.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`UPDATE intent_trace_events SET first_seq = 99 WHERE seq IN (3, 4)`)
		return err
	})
	require.NoError(t, err)
	tr, err := b.log.Trace(ctx, "a")
	require.NoError(t, err)
	require.Len(t, tr, 2) // seq 3 is lost to Trace
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	var firsts []int64
	require.NoError(t, b.log.ReadDB().Select(&firsts, `SELECT first_seq FROM intent_trace_events ORDER BY seq`))
	require.Equal(t, []int64{1, 2, 1, 2, 1}, firsts)
	tr, err = b.log.Trace(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, []State{Received, Validated, Dispatched}, []State{tr[0].State, tr[1].State, tr[2].State})
}
