package legacytest

import (
	"database/sql"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/beamdir/beam/tracing"
)

// Part is one set of legacy tables with their rows.
type Part int

// The parts a fixture database can hold. Directory and
// DirectoryWithoutNonce both define intent_log and cannot be combined.
const (
	// Directory is a directory database of the current reference schema
	// (intent_log with nonce, intent_trace_events) holding legacy statuses
	// and stages.
	Directory Part = iota + 1
	// DirectoryWithoutNonce is an old intent_log without the nonce and
	// result_json columns and without trace events.
	DirectoryWithoutNonce
	// Bus is a message bus database (beam_messages) with a row in every
	// status.
	Bus
)

// Name is the file name stem of the part's SQL dump under fixtures/legacy.
func (p Part) Name() string {
	switch p {
	case Directory:
		return "directory"
	case DirectoryWithoutNonce:
		return "directory-without-nonce"
	case Bus:
		return "bus"
	}
	return "unknown"
}

// Parts lists every part.
var Parts = []Part{Directory, DirectoryWithoutNonce, Bus}

// Script returns the SQL that creates the parts' tables and rows.
func Script(parts ...Part) string {
	var b strings.Builder
	for _, p := range parts {
		switch p {
		case Directory:
			b.WriteString(SchemaDirectory)
			b.WriteString(rowsDirectory)
		case DirectoryWithoutNonce:
			b.WriteString(schemaDirectoryWithoutNonce)
			b.WriteString(rowsDirectoryWithoutNonce)
		case Bus:
			b.WriteString(schemaBus)
			b.WriteString(rowsBus)
		}
	}
	return b.String()
}

// Build creates a SQLite database at path from Script(parts...) and returns
// path. It fails the test on any error.
func Build(t testing.TB, path string, parts ...Part) string {
	t.Helper()
	require.False(t, slices.Contains(parts, Directory) && slices.Contains(parts, DirectoryWithoutNonce),
		"Directory and DirectoryWithoutNonce both define intent_log")
	Exec(t, path, Script(parts...))
	return path
}

// Exec runs a SQL script against the SQLite database at path, creating it if
// needed.
func Exec(t testing.TB, path, script string) {
	t.Helper()
	u := url.URL{Scheme: "file", OmitHost: true, Path: path}
	db, err := sql.Open("sqlite", u.String())
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(script)
	require.NoError(t, err, "run legacy fixture script")
}

// Want is what importing one legacy nonce should produce.
type Want struct {
	// Table is the legacy table the nonce comes from.
	Table string
	// States is the expected sequence of event states.
	States []tracing.State
	// Owner is the expected owner of the intent.
	Owner tracing.Owner
	// LegacyStatus is the expected Details.LegacyStatus of the final event
	// ("" when the label is canonical already).
	LegacyStatus string
}

// Final is the expected final state.
func (w Want) Final() tracing.State { return w.States[len(w.States)-1] }

// Broken is a legacy row that an import must reject.
type Broken struct {
	// Table and RowID name the offending row.
	Table string
	RowID string
	// Reason is a fragment of the expected error text.
	Reason string
}

// Expected returns, per nonce, what importing the parts should write and
// which nonces must be rejected.
func Expected(parts ...Part) (want map[string]Want, broken map[string]Broken) {
	want, broken = map[string]Want{}, map[string]Broken{}
	for _, p := range parts {
		var w map[string]Want
		var b map[string]Broken
		switch p {
		case Directory:
			w, b = wantDirectory, brokenDirectory
		case DirectoryWithoutNonce:
			w, b = wantDirectoryWithoutNonce, brokenDirectoryWithoutNonce
		case Bus:
			w, b = wantBus, brokenBus
		}
		for k, v := range w {
			want[k] = v
		}
		for k, v := range b {
			broken[k] = v
		}
	}
	return want, broken
}

// SchemaDirectory creates the directory tables of the reference (intent_log
// with nonce, intent_trace_events) and their indexes.
const SchemaDirectory = `CREATE TABLE intent_log (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  nonce TEXT NOT NULL UNIQUE,
  from_beam_id TEXT NOT NULL,
  to_beam_id TEXT NOT NULL,
  intent_type TEXT NOT NULL,
  requested_at TEXT NOT NULL,
  completed_at TEXT,
  round_trip_latency_ms INTEGER,
  status TEXT NOT NULL DEFAULT 'received',
  error_code TEXT,
  result_json TEXT
);
CREATE INDEX idx_intent_log_requested_at ON intent_log(requested_at DESC);
CREATE INDEX idx_intent_log_pair ON intent_log(from_beam_id, to_beam_id);
CREATE TABLE intent_trace_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  nonce TEXT NOT NULL,
  from_beam_id TEXT NOT NULL,
  to_beam_id TEXT NOT NULL,
  intent_type TEXT NOT NULL,
  stage TEXT NOT NULL,
  status TEXT NOT NULL,
  timestamp TEXT NOT NULL,
  details TEXT
);
CREATE INDEX idx_intent_trace_events_timestamp ON intent_trace_events(timestamp DESC);
CREATE INDEX idx_intent_trace_events_nonce ON intent_trace_events(nonce, timestamp ASC, id ASC);
`

// schemaDirectoryWithoutNonce creates an old intent_log that predates the
// nonce and result_json columns.
const schemaDirectoryWithoutNonce = `CREATE TABLE intent_log (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  from_beam_id TEXT NOT NULL,
  to_beam_id TEXT NOT NULL,
  intent_type TEXT NOT NULL,
  requested_at TEXT NOT NULL,
  completed_at TEXT,
  round_trip_latency_ms INTEGER,
  status TEXT NOT NULL DEFAULT 'pending',
  error_code TEXT
);
`

// schemaBus creates the bus table beam_messages and its indexes.
const schemaBus = `CREATE TABLE beam_messages (
  id TEXT PRIMARY KEY,
  nonce TEXT,
  sender TEXT NOT NULL,
  recipient TEXT NOT NULL,
  intent TEXT NOT NULL,
  payload TEXT NOT NULL DEFAULT '{}',
  status TEXT DEFAULT 'received',
  priority INT DEFAULT 0,
  retry_count INT DEFAULT 0,
  max_retries INT DEFAULT 5,
  next_retry_at REAL,
  created_at REAL NOT NULL,
  delivered_at REAL,
  acked_at REAL,
  failed_at REAL,
  error TEXT,
  response TEXT,
  trace_id TEXT,
  metadata TEXT
);
CREATE UNIQUE INDEX idx_beam_nonce ON beam_messages(nonce);
CREATE INDEX idx_beam_recipient_status ON beam_messages(recipient, status);
CREATE INDEX idx_beam_sender ON beam_messages(sender);
CREATE INDEX idx_beam_created ON beam_messages(created_at);
CREATE INDEX idx_beam_status_retry ON beam_messages(status, next_retry_at);
`
