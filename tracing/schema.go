package tracing

// schemaVersion is PRAGMA user_version of a log created by this package.
// Version 1 had no first_seq columns; Open migrates it (see migrateV1).
const schemaVersion = 2

const createEvents = `
CREATE TABLE IF NOT EXISTS intent_trace_events(
  seq          INTEGER PRIMARY KEY,
  nonce        TEXT NOT NULL,
  state        TEXT NOT NULL,
  at           INTEGER NOT NULL,
  from_beam_id TEXT NOT NULL DEFAULT '',
  to_beam_id   TEXT NOT NULL DEFAULT '',
  intent_type  TEXT NOT NULL DEFAULT '',
  transport    TEXT NOT NULL DEFAULT '',
  attempt      INTEGER NOT NULL DEFAULT 0,
  details      TEXT NOT NULL DEFAULT '{}',
  first_seq    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS intent_trace_events_first_seq ON intent_trace_events(first_seq);
`

// migrateV1 turns a version 1 log into a version 2 one: events get the
// first seq of their nonce (found through the old (nonce, seq) index, which
// is then dropped) and intent_log is recreated empty with first_seq as its
// key; Open then rebuilds the projections.
var migrateV1 = []string{
	`ALTER TABLE intent_trace_events ADD COLUMN first_seq INTEGER NOT NULL DEFAULT 0`,
	`UPDATE intent_trace_events SET first_seq = f.s
	   FROM (SELECT nonce, MIN(seq) AS s FROM intent_trace_events GROUP BY nonce) AS f
	  WHERE f.nonce = intent_trace_events.nonce`,
	`DROP INDEX IF EXISTS intent_trace_events_nonce_seq`,
	`DROP TABLE IF EXISTS intent_log`,
}

// eventsByNonce is the condition that selects the events of one nonce
// (bound twice to the nonce): it goes through intent_log's nonce index to
// the nonce's first seq, whose index lists the events in seq order. The
// nonce test keeps the answer exact even if the projection were damaged.
const eventsByNonce = `first_seq = (SELECT first_seq FROM intent_log WHERE nonce = ?) AND nonce = ?`

const createIntentLog = `
CREATE TABLE IF NOT EXISTS intent_log(
  nonce                 TEXT NOT NULL,
  from_beam_id          TEXT NOT NULL DEFAULT '',
  to_beam_id            TEXT NOT NULL DEFAULT '',
  intent_type           TEXT NOT NULL DEFAULT '',
  owner                 TEXT NOT NULL DEFAULT 'directory',
  status                TEXT NOT NULL,
  requested_at          INTEGER NOT NULL,
  client_timestamp      TEXT NOT NULL DEFAULT '',
  attempt               INTEGER NOT NULL DEFAULT 0,
  transport             TEXT NOT NULL DEFAULT '',
  timeout_ms            INTEGER NOT NULL DEFAULT 0,
  error_code            TEXT NOT NULL DEFAULT '',
  completed_at          INTEGER,
  round_trip_latency_ms INTEGER,
  result_json           TEXT,
  updated_at            INTEGER NOT NULL,
  last_seq              INTEGER NOT NULL,
  first_seq             INTEGER PRIMARY KEY
);
`

// indexIntentLog are the secondary indexes of intent_log. Rebuild creates
// them after the bulk load.
const indexIntentLog = `
CREATE UNIQUE INDEX IF NOT EXISTS intent_log_nonce ON intent_log(nonce);
CREATE INDEX IF NOT EXISTS intent_log_status ON intent_log(status);
CREATE INDEX IF NOT EXISTS intent_log_requested_at ON intent_log(requested_at);
`

// createProjSeq holds the projections' high-water mark: every event up to
// seq is folded into intent_log, beam_messages and beam_mesh, and later
// events may not be (their rows are written behind the log, see
// behind.go). A log created before the mark existed had its projections
// written with its events, so the mark starts at its last event.
const createProjSeq = `
CREATE TABLE IF NOT EXISTS projection_seq(id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL);
INSERT OR IGNORE INTO projection_seq(id, seq) SELECT 1, COALESCE(MAX(seq), 0) FROM intent_trace_events;
`

// setProjSeq moves the projections' high-water mark.
const setProjSeq = `UPDATE projection_seq SET seq = ? WHERE id = 1`

// selectProjSeq reads the projections' high-water mark.
const selectProjSeq = `SELECT seq FROM projection_seq WHERE id = 1`

const createMessages = `
CREATE TABLE IF NOT EXISTS beam_messages(
  id               TEXT PRIMARY KEY,
  nonce            TEXT NOT NULL UNIQUE,
  sender           TEXT NOT NULL,
  recipient        TEXT NOT NULL,
  intent           TEXT NOT NULL,
  payload          TEXT NOT NULL DEFAULT '{}',
  status           TEXT NOT NULL,
  priority         INTEGER NOT NULL DEFAULT 0,
  retry_count      INTEGER NOT NULL DEFAULT 0,
  max_retries      INTEGER NOT NULL DEFAULT 5,
  next_retry_at    REAL,
  created_at       REAL NOT NULL,
  delivered_at     REAL,
  acked_at         REAL,
  failed_at        REAL,
  error            TEXT NOT NULL DEFAULT '',
  response         TEXT,
  trace_id         TEXT NOT NULL DEFAULT '',
  metadata         TEXT,
  lease_owner      TEXT NOT NULL DEFAULT '',
  lease_expires_at REAL,
  updated_at       REAL NOT NULL,
  last_seq         INTEGER NOT NULL
);
`

const indexMessages = `
CREATE INDEX IF NOT EXISTS beam_messages_recipient_status ON beam_messages(recipient, status);
CREATE INDEX IF NOT EXISTS beam_messages_status_next_retry ON beam_messages(status, next_retry_at);
CREATE INDEX IF NOT EXISTS beam_messages_sender ON beam_messages(sender);
CREATE INDEX IF NOT EXISTS beam_messages_created_at ON beam_messages(created_at);
`

const eventCols = `seq, nonce, state, at, from_beam_id, to_beam_id, intent_type, transport, attempt, details`

// eventInsertCols are the columns the writer inserts per event. seq is not
// among them: the writer inserts its events in seq order, consecutive with
// the last row, so SQLite's next rowid (the largest plus one) is the seq the
// writer gave the event, and SQLite appends the row without first searching
// the table for a row with that seq. flushEvents checks that the rowids
// came out as the seqs.
const eventInsertCols = `nonce, state, at, from_beam_id, to_beam_id, intent_type, transport, attempt, details, first_seq`

const eventInsertWidth = 10

const intentCols = `nonce, from_beam_id, to_beam_id, intent_type, owner, status, requested_at, client_timestamp,
  attempt, transport, timeout_ms, error_code, completed_at, round_trip_latency_ms, result_json, updated_at, last_seq,
  first_seq`

const intentWidth = 18

// updateIntent rewrites the columns the fold may change after the first
// event (nonce, owner, requested_at and client_timestamp never change), so
// that SQLite leaves the requested_at index alone.
const updateIntent = `UPDATE intent_log SET from_beam_id=?, to_beam_id=?, intent_type=?, status=?, attempt=?,
  transport=?, timeout_ms=?, error_code=?, completed_at=?, round_trip_latency_ms=?, result_json=?, updated_at=?,
  last_seq=? WHERE first_seq=?`

const selectIntent = `SELECT ` + intentCols + ` FROM intent_log WHERE nonce = ?`

// selectIntentSeq reads a row by its first seq (Rebuild knows it from the
// event).
const selectIntentSeq = `SELECT ` + intentCols + ` FROM intent_log WHERE first_seq = ?`

const messageCols = `id, nonce, sender, recipient, intent, payload, status, priority, retry_count, max_retries,
  next_retry_at, created_at, delivered_at, acked_at, failed_at, error, response, trace_id, metadata,
  lease_owner, lease_expires_at, updated_at, last_seq`

const messageWidth = 23

// updateMessage rewrites the columns the fold may change after the first
// event.
const updateMessage = `UPDATE beam_messages SET status=?, retry_count=?, next_retry_at=?, delivered_at=?, acked_at=?,
  failed_at=?, error=?, response=?, lease_owner=?, lease_expires_at=?, updated_at=?, last_seq=? WHERE nonce=?`

const selectMessage = `SELECT ` + messageCols + ` FROM beam_messages WHERE nonce = ?`

const selectMessageID = `SELECT nonce FROM beam_messages WHERE id = ?`

// terminalList is the SQL list of terminal states.
const terminalList = `('acked','failed','dead_letter')`

// openList is the SQL list of the states that are not terminal. Queries for
// the open rows say "status IN openList", never "NOT IN terminalList": IN
// walks the status index for those few values, NOT IN reads every row, and
// on a log of millions of finished intents that is the difference between
// a start that grows with what was in flight and one that grows with the
// log.
const openList = `('received','validated','queued','dispatched','delivered')`

// scanner is *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

func scanIntent(s scanner, r *IntentRow) error {
	return s.Scan(&r.Nonce, &r.From, &r.To, &r.IntentType, &r.Owner, &r.Status, &r.RequestedAt,
		&r.ClientTimestamp, &r.Attempt, &r.Transport, &r.TimeoutMs, &r.ErrorCode, &r.CompletedAt,
		&r.RoundTripLatencyMs, &r.ResultJSON, &r.UpdatedAt, &r.LastSeq, &r.FirstSeq)
}

func scanMessage(s scanner, m *MessageRow) error {
	return s.Scan(&m.ID, &m.Nonce, &m.Sender, &m.Recipient, &m.Intent, &m.Payload, &m.Status, &m.Priority,
		&m.RetryCount, &m.MaxRetries, &m.NextRetryAt, &m.CreatedAt, &m.DeliveredAt, &m.AckedAt, &m.FailedAt,
		&m.Error, &m.Response, &m.TraceID, &m.Metadata, &m.LeaseOwner, &m.LeaseExpiresAt, &m.UpdatedAt,
		&m.LastSeq)
}
