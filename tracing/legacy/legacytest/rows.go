package legacytest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/beamdir/beam/tracing"
)

// Beam IDs and the intent type used by the fixture rows.
const (
	Alice      = "alice@acme.beam.directory"
	Bob        = "bob@acme.beam.directory"
	IntentType = "task.request"
)

// short names for the states in the expectations below.
const (
	rc = tracing.Received
	va = tracing.Validated
	qu = tracing.Queued
	di = tracing.Dispatched
	de = tracing.Delivered
	ac = tracing.Acked
	fa = tracing.Failed
	dl = tracing.DeadLetter
)

// trace is one intent_trace_events row. ts is a time of day on 2024-03-01.
type trace struct {
	id            int
	stage, status string
	ts            string
	details       string
}

// intent is one intent_log row with its trace rows and the expected result.
type intent struct {
	id                     int
	nonce                  string
	status                 string
	requested, completed   string // times of day on 2024-03-01; completed may be ""
	latency                int    // 0 is NULL
	errorCode, resultJSON  string // "" is NULL
	traces                 []trace
	want                   []tracing.State
	legacyStatus           string // expected LegacyStatus of the final event
	brokenTable, brokenRow string // set for rows the import must reject
	reason                 string
}

func day(tod string) string { return "2024-03-01T" + tod + "Z" }

// directoryIntents are the rows of the Directory part. Trace ids are
// explicit so that rejections can name them.
var directoryIntents = []intent{
	{id: 1, nonce: "n-legacy-acked", status: "success", requested: "10:00:00.000", completed: "10:00:00.520", latency: 420,
		resultJSON: `{"v":"1","success":true,"nonce":"n-legacy-acked","payload":{"ok":true}}`,
		traces: []trace{
			{101, "sender_lookup", "success", "10:00:00.100", `{"actingBeamId":"alice@acme.beam.directory"}`},
			{102, "validated", "success", "10:00:00.110", ``},
			{103, "dispatch", "pending", "10:00:00.120", `{"transport":"ws","timeoutMs":30000}`},
			{104, "delivery", "success", "10:00:00.200", `{"transport":"ws"}`},
			{105, "completed", "success", "10:00:00.520", `{"latencyMs":420}`},
		},
		want: []tracing.State{rc, va, di, de, ac}, legacyStatus: "success"},
	{id: 2, nonce: "n-legacy-federated", status: "success", requested: "10:01:00.000", completed: "10:01:01.000",
		resultJSON: `{"v":"1","success":true,"nonce":"n-legacy-federated"}`,
		traces: []trace{
			{201, "sender_lookup", "success", "10:01:00.010", ``},
			{202, "dispatch", "pending", "10:01:00.020", `{"transport":"federation"}`},
			{203, "federation.resolve", "success", "10:01:00.030", `{"peerUrl":"https://peer.example","hopCount":1}`},
			{204, "federation.relay", "success", "10:01:00.400", `{"transport":"federation","hopCount":1}`},
			{205, "completed", "success", "10:01:01.000", ``},
		},
		want: []tracing.State{rc, di, di, de, ac}, legacyStatus: "success"},
	{id: 3, nonce: "n-legacy-offline", status: "error", requested: "10:02:00.000", completed: "10:02:00.300", errorCode: "OFFLINE",
		traces: []trace{
			{301, "sender_lookup", "success", "10:02:00.010", ``},
			{302, "dispatch", "pending", "10:02:00.020", `{"transport":"ws"}`},
			{303, "delivery", "error", "10:02:00.100", `{"errorCode":"OFFLINE","error":"recipient offline"}`},
			{304, "completed", "error", "10:02:00.300", ``},
		},
		want: []tracing.State{rc, di, fa, fa}, legacyStatus: "error"},
	{id: 4, nonce: "n-legacy-forbidden", status: "error", requested: "10:03:00.000", completed: "10:03:00.050", errorCode: "FORBIDDEN",
		traces: []trace{
			{401, "sender_lookup", "success", "10:03:00.010", ``},
			{402, "validated", "error", "10:03:00.050", `{"errorCode":"FORBIDDEN"}`},
		},
		want: []tracing.State{rc, fa}, legacyStatus: "error"},
	{id: 5, nonce: "n-legacy-dedupe", status: "success", requested: "10:04:00.000", completed: "10:04:00.500",
		traces: []trace{
			{501, "sender_lookup", "success", "10:04:00.010", ``},
			{502, "dedupe", "success", "10:04:00.011", `{"duplicateOf":"n-legacy-dedupe"}`},
			{503, "dispatch", "pending", "10:04:00.020", ``},
			{504, "delivery", "success", "10:04:00.100", ``},
			{505, "completed", "success", "10:04:00.500", ``},
		},
		want: []tracing.State{rc, di, de, ac}, legacyStatus: "success"},
	{id: 6, nonce: "n-legacy-resolve-failed", status: "error", requested: "10:05:00.000", completed: "10:05:00.090", errorCode: "PEER_UNREACHABLE",
		traces: []trace{
			{601, "sender_lookup", "success", "10:05:00.010", ``},
			{602, "federation.resolve", "error", "10:05:00.090", `{"peerUrl":"https://gone.example"}`},
		},
		want: []tracing.State{rc, fa}, legacyStatus: "error"},
	{id: 7, nonce: "n-legacy-relay-failed", status: "error", requested: "10:06:00.000", completed: "10:06:00.200", errorCode: "DELIVERY_FAILED",
		traces: []trace{
			{701, "sender_lookup", "success", "10:06:00.010", ``},
			{702, "dispatch", "pending", "10:06:00.020", `{"transport":"federation"}`},
			{703, "federation.relay", "error", "10:06:00.200", ``},
		},
		want: []tracing.State{rc, di, fa}, legacyStatus: "error"},
	{id: 8, nonce: "n-pending-no-trace", status: "pending", requested: "10:07:00.000",
		want: []tracing.State{rc}, legacyStatus: "pending"},
	{id: 9, nonce: "n-expired-no-trace", status: "expired", requested: "10:08:00.000", completed: "10:08:30.000",
		want: []tracing.State{rc, dl}, legacyStatus: "expired"},
	{id: 10, nonce: "n-success-no-trace", status: "success", requested: "10:09:00.000", completed: "10:09:00.250", latency: 250,
		resultJSON: `{"v":"1","success":true,"nonce":"n-success-no-trace"}`,
		want:       []tracing.State{rc, di, de, ac}, legacyStatus: "success"},
	{id: 11, nonce: "n-error-no-trace", status: "error", requested: "10:10:00.000", completed: "10:10:30.000", errorCode: "TIMEOUT",
		want: []tracing.State{rc, fa}, legacyStatus: "error"},
	{id: 12, nonce: "n-canonical", status: "acked", requested: "10:11:00.000", completed: "10:11:00.300",
		resultJSON: `{"v":"1","success":true,"nonce":"n-canonical"}`,
		traces: []trace{
			{1201, "received", "received", "10:11:00.010", `{"transport":"http"}`},
			{1202, "validated", "validated", "10:11:00.020", ``},
			{1203, "dispatched", "dispatched", "10:11:00.030", `{"transport":"http","timeoutMs":30000,"attempt":1}`},
			{1204, "delivered", "delivered", "10:11:00.100", ``},
			{1205, "acked", "acked", "10:11:00.300", `{"latencyMs":290}`},
		},
		want: []tracing.State{rc, va, di, de, ac}},
	{id: 13, nonce: "n-no-received-trace", status: "success", requested: "10:12:00.000", completed: "10:12:00.400",
		traces: []trace{
			{1301, "dispatch", "pending", "10:12:00.020", ``},
			{1302, "delivery", "success", "10:12:00.100", ``},
			{1303, "completed", "success", "10:12:00.400", ``},
		},
		want: []tracing.State{rc, di, de, ac}, legacyStatus: "success"},
	{id: 14, nonce: "n-log-ahead", status: "success", requested: "10:13:00.000", completed: "10:13:00.900",
		resultJSON: `{"v":"1","success":true,"nonce":"n-log-ahead"}`,
		traces: []trace{
			{1401, "sender_lookup", "success", "10:13:00.010", ``},
			{1402, "dispatch", "pending", "10:13:00.020", ``},
			{1403, "delivery", "success", "10:13:00.100", ``},
		},
		want: []tracing.State{rc, di, de, ac}, legacyStatus: "success"},
	{id: 15, nonce: "n-double-completed", status: "success", requested: "10:14:00.000", completed: "10:14:00.400",
		traces: []trace{
			{1501, "sender_lookup", "success", "10:14:00.010", ``},
			{1502, "dispatch", "pending", "10:14:00.020", ``},
			{1503, "delivery", "success", "10:14:00.100", ``},
			{1504, "completed", "success", "10:14:00.400", ``},
			{1505, "completed", "success", "10:14:00.401", ``},
		},
		want: []tracing.State{rc, di, de, ac}, legacyStatus: "success"},
	// Inserted out of order: the trace is read in (timestamp, id) order.
	{id: 16, nonce: "n-out-of-order", status: "success", requested: "10:15:00.000", completed: "10:15:00.400",
		traces: []trace{
			{1604, "completed", "success", "10:15:00.400", ``},
			{1601, "sender_lookup", "success", "10:15:00.010", ``},
			{1603, "delivery", "success", "10:15:00.100", ``},
			{1602, "dispatch", "pending", "10:15:00.020", ``},
		},
		want: []tracing.State{rc, di, de, ac}, legacyStatus: "success"},
	// Rows an import must reject.
	{id: 17, nonce: "n-broken-retry", status: "error", requested: "10:16:00.000", completed: "10:16:05.000", errorCode: "OFFLINE",
		traces: []trace{
			{1701, "sender_lookup", "success", "10:16:00.010", ``},
			{1702, "dispatch", "pending", "10:16:00.020", ``},
			{1703, "delivery", "error", "10:16:00.100", `{"errorCode":"OFFLINE"}`},
			{1704, "sender_lookup", "success", "10:16:05.000", `{"retry":true}`},
			{1705, "dispatch", "pending", "10:16:05.010", ``},
		},
		brokenTable: "intent_trace_events", brokenRow: "1704", reason: "illegal transition failed -> received"},
	{id: 18, nonce: "n-acked-then-more", status: "success", requested: "10:17:00.000", completed: "10:17:00.400",
		traces: []trace{
			{1801, "sender_lookup", "success", "10:17:00.010", ``},
			{1802, "dispatch", "pending", "10:17:00.020", ``},
			{1803, "delivery", "success", "10:17:00.100", ``},
			{1804, "completed", "success", "10:17:00.400", ``},
			{1805, "delivery", "success", "10:17:01.000", `{"lateResult":true}`},
		},
		brokenTable: "intent_trace_events", brokenRow: "1805", reason: "illegal transition acked -> delivered"},
	{id: 19, nonce: "n-bad-details", status: "success", requested: "10:18:00.000", completed: "10:18:00.400",
		traces: []trace{
			{1901, "sender_lookup", "success", "10:18:00.010", ``},
			{1902, "dispatch", "pending", "10:18:00.020", `{not json`},
		},
		brokenTable: "intent_trace_events", brokenRow: "1902", reason: "malformed details JSON"},
	{id: 20, nonce: "n-unknown-status", status: "bogus", requested: "10:19:00.000",
		brokenTable: "intent_log", brokenRow: "20", reason: `unknown legacy status "bogus"`},
	{id: 21, nonce: "n-unknown-stage", status: "success", requested: "10:20:00.000",
		traces: []trace{
			{2101, "sender_lookup", "success", "10:20:00.010", ``},
			{2102, "teleport", "maybe", "10:20:00.020", ``},
		},
		brokenTable: "intent_trace_events", brokenRow: "2102", reason: `unknown legacy stage "teleport"`},
	{id: 22, nonce: "n-log-contradicts", status: "success", requested: "10:21:00.000", completed: "10:21:00.400",
		traces: []trace{
			{2201, "sender_lookup", "success", "10:21:00.010", ``},
			{2202, "completed", "error", "10:21:00.400", ``},
		},
		brokenTable: "intent_log", brokenRow: "22", reason: "cannot follow the trace's final state failed"},
	{id: 23, nonce: "n-bad-result", status: "success", requested: "10:22:00.000", completed: "10:22:00.400",
		resultJSON:  `{broken`,
		brokenTable: "intent_log", brokenRow: "23", reason: "result_json: malformed JSON"},
	{id: 24, nonce: "n-bad-timestamp", status: "pending", requested: "yesterday-ish",
		brokenTable: "intent_log", brokenRow: "24", reason: "requested_at: malformed timestamp"},
}

// orphanTraces are trace rows whose nonce has no intent_log row.
var orphanTraces = []struct {
	nonce string
	trace
}{
	{"n-orphan", trace{9001, "received", "received", "10:30:00.000", `{"transport":"ws"}`}},
	{"n-orphan", trace{9002, "dispatched", "dispatched", "10:30:00.010", `{"transport":"ws"}`}},
}

// sqlText quotes s as a SQL string literal, or NULL for "".
func sqlText(s string) string {
	if s == "" {
		return "NULL"
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// sqlInt renders n, or NULL for 0.
func sqlInt(n int) string {
	if n == 0 {
		return "NULL"
	}
	return strconv.Itoa(n)
}

func traceInsert(nonce string, t trace) string {
	return fmt.Sprintf("INSERT INTO intent_trace_events (id, nonce, from_beam_id, to_beam_id, intent_type, stage, status, timestamp, details) VALUES (%d, %s, %s, %s, %s, %s, %s, %s, %s);\n",
		t.id, sqlText(nonce), sqlText(Alice), sqlText(Bob), sqlText(IntentType), sqlText(t.stage), sqlText(t.status),
		sqlText(day(t.ts)), sqlText(t.details))
}

var (
	rowsDirectory   string
	wantDirectory   = map[string]Want{}
	brokenDirectory = map[string]Broken{}
)

func init() {
	var b strings.Builder
	for _, in := range directoryIntents {
		completed := ""
		if in.completed != "" {
			completed = day(in.completed)
		}
		requested := in.requested
		if strings.Contains(requested, ":") {
			requested = day(requested)
		}
		fmt.Fprintf(&b, "INSERT INTO intent_log (id, nonce, from_beam_id, to_beam_id, intent_type, requested_at, completed_at, round_trip_latency_ms, status, error_code, result_json) VALUES (%d, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);\n",
			in.id, sqlText(in.nonce), sqlText(Alice), sqlText(Bob), sqlText(IntentType), sqlText(requested),
			sqlText(completed), sqlInt(in.latency), sqlText(in.status), sqlText(in.errorCode), sqlText(in.resultJSON))
		for _, t := range in.traces {
			b.WriteString(traceInsert(in.nonce, t))
		}
		if in.brokenTable != "" {
			brokenDirectory[in.nonce] = Broken{Table: in.brokenTable, RowID: in.brokenRow, Reason: in.reason}
			continue
		}
		wantDirectory[in.nonce] = Want{Table: "intent_log", States: in.want, Owner: tracing.OwnerDirectory, LegacyStatus: in.legacyStatus}
	}
	for _, o := range orphanTraces {
		b.WriteString(traceInsert(o.nonce, o.trace))
	}
	wantDirectory["n-orphan"] = Want{Table: "intent_trace_events", States: []tracing.State{rc, di}, Owner: tracing.OwnerDirectory}
	rowsDirectory = b.String()
}

// rowsDirectoryWithoutNonce fill the old intent_log; their nonces become
// legacy-intent-<id>.
const rowsDirectoryWithoutNonce = `INSERT INTO intent_log (id, from_beam_id, to_beam_id, intent_type, requested_at, completed_at, round_trip_latency_ms, status, error_code) VALUES
  (1, 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '2023-11-02 08:00:00', NULL, NULL, 'pending', NULL),
  (2, 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '2023-11-02 08:01:00', '2023-11-02 08:01:01', 800, 'success', NULL),
  (3, 'bob@acme.beam.directory', 'alice@acme.beam.directory', 'task.request', '2023-11-02 08:02:00', '2023-11-02 08:02:30', NULL, 'error', 'TIMEOUT'),
  (4, 'bob@acme.beam.directory', 'alice@acme.beam.directory', 'task.request', '2023-11-02 08:03:00', '2023-11-02 08:10:00', NULL, 'expired', NULL),
  (5, 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '2023-11-02 08:04:00', NULL, NULL, 'half-done', NULL),
  (6, 'alice@acme.beam.directory', '', 'task.request', '2023-11-02 08:05:00', NULL, NULL, 'pending', NULL);
`

var (
	wantDirectoryWithoutNonce = map[string]Want{
		"legacy-intent-1": {Table: "intent_log", States: []tracing.State{rc}, Owner: tracing.OwnerDirectory, LegacyStatus: "pending"},
		"legacy-intent-2": {Table: "intent_log", States: []tracing.State{rc, di, de, ac}, Owner: tracing.OwnerDirectory, LegacyStatus: "success"},
		"legacy-intent-3": {Table: "intent_log", States: []tracing.State{rc, fa}, Owner: tracing.OwnerDirectory, LegacyStatus: "error"},
		"legacy-intent-4": {Table: "intent_log", States: []tracing.State{rc, dl}, Owner: tracing.OwnerDirectory, LegacyStatus: "expired"},
	}
	brokenDirectoryWithoutNonce = map[string]Broken{
		"legacy-intent-5": {Table: "intent_log", RowID: "5", Reason: `unknown legacy status "half-done"`},
		"legacy-intent-6": {Table: "intent_log", RowID: "6", Reason: "to_beam_id is empty"},
	}
)

// rowsBus fill beam_messages: one row per status (legacy pending and
// expired included) and malformed rows. Times are epoch seconds around
// 2024-03-01T12:00:00Z (1709294400).
const rowsBus = `INSERT INTO beam_messages (id, nonce, sender, recipient, intent, payload, status, priority, retry_count, max_retries, next_retry_at, created_at, delivered_at, acked_at, failed_at, error, response, trace_id, metadata) VALUES
  ('0b5e7c1a00000000000000000000a001', 'b-received', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":1}', 'received', 0, 0, 5, NULL, 1709294400.25, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a002', NULL, 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":2}', 'pending', 0, 2, 5, 1709294490.5, 1709294401, NULL, NULL, NULL, 'HTTP 503', NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a003', 'b-queued', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":3}', 'queued', 1, 0, 5, 1709294402, 1709294402, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a004', 'b-dispatched', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":4}', 'dispatched', 0, 0, 5, NULL, 1709294403, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a005', 'b-delivered', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":5}', 'delivered', 0, 0, 5, NULL, 1709294404, 1709294404.5, NULL, NULL, NULL, NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a006', 'b-acked', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":6}', 'acked', 5, 1, 3, NULL, 1709294405, 1709294405.5, 1709294406, NULL, NULL, '{"ok":true}', 'trace-6', '{"source":"fixture"}'),
  ('0b5e7c1a00000000000000000000a007', 'b-failed', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":7}', 'failed', 0, 0, 5, NULL, 1709294407, NULL, NULL, 1709294408, 'FORBIDDEN', NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a008', 'b-dead-letter', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{"n":8}', 'dead_letter', 0, 4, 5, NULL, 1709294409, 1709294410, NULL, 1709295000, 'HTTP 500', NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a009', 'b-expired', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{}', 'expired', 0, 5, 5, NULL, 1709294411, NULL, NULL, 1709296000, 'expired', NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a010', 'b-zombie', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{}', 'zombie', 0, 0, 5, NULL, 1709294412, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a011', 'b-bad-payload', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{oops', 'received', 0, 0, 5, NULL, 1709294413, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  ('0b5e7c1a00000000000000000000a012', 'b-bad-response', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{}', 'acked', 0, 0, 5, NULL, 1709294414, 1709294415, 1709294416, NULL, NULL, '[1,', NULL, NULL),
  ('0b5e7c1a00000000000000000000a013', 'b-bad-retries', 'alice@acme.beam.directory', 'bob@acme.beam.directory', 'task.request', '{}', 'queued', 0, 'many', 5, NULL, 1709294417, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
`

var (
	wantBus = map[string]Want{
		"b-received":                       {Table: "beam_messages", States: []tracing.State{rc}, Owner: tracing.OwnerBus},
		"0b5e7c1a00000000000000000000a002": {Table: "beam_messages", States: []tracing.State{rc, qu}, Owner: tracing.OwnerBus, LegacyStatus: "pending"},
		"b-queued":                         {Table: "beam_messages", States: []tracing.State{rc, qu}, Owner: tracing.OwnerBus},
		"b-dispatched":                     {Table: "beam_messages", States: []tracing.State{rc, di}, Owner: tracing.OwnerBus},
		"b-delivered":                      {Table: "beam_messages", States: []tracing.State{rc, di, de}, Owner: tracing.OwnerBus},
		"b-acked":                          {Table: "beam_messages", States: []tracing.State{rc, di, de, ac}, Owner: tracing.OwnerBus},
		"b-failed":                         {Table: "beam_messages", States: []tracing.State{rc, fa}, Owner: tracing.OwnerBus},
		"b-dead-letter":                    {Table: "beam_messages", States: []tracing.State{rc, di, de, dl}, Owner: tracing.OwnerBus},
		"b-expired":                        {Table: "beam_messages", States: []tracing.State{rc, dl}, Owner: tracing.OwnerBus, LegacyStatus: "expired"},
	}
	brokenBus = map[string]Broken{
		"b-zombie":       {Table: "beam_messages", RowID: "0b5e7c1a00000000000000000000a010", Reason: `unknown legacy status "zombie"`},
		"b-bad-payload":  {Table: "beam_messages", RowID: "0b5e7c1a00000000000000000000a011", Reason: "payload: malformed JSON"},
		"b-bad-response": {Table: "beam_messages", RowID: "0b5e7c1a00000000000000000000a012", Reason: "response: malformed JSON"},
		"b-bad-retries":  {Table: "beam_messages", RowID: "0b5e7c1a00000000000000000000a013", Reason: "retry_count: not an integer"},
	}
)
