package legacy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/beamdir/beam/tracing"
)

// Names of the legacy tables, as they appear in RowError.Table.
const (
	tableIntentLog   = "intent_log"
	TableTraceEvents = "intent_trace_events"
	TableMessages    = "beam_messages"
)

// Keys Import adds to Details.Extra.
const (
	// ExtraSynthesized marks an event that has no legacy row of its own: it
	// was made up to give the imported sequence a legal shape (a received
	// event before a trace that lacks one, the intermediate steps towards an
	// intent_log or beam_messages status).
	ExtraSynthesized = "legacySynthesized"
	// ExtraTraceEventID is the id of the legacy intent_trace_events row an
	// event was made from.
	ExtraTraceEventID = "legacyTraceEventId"
	// extraIntentLogStatus keeps an intent_log status that the imported trace
	// did not end in because the trace had already moved past it.
	extraIntentLogStatus = "legacyIntentLogStatus"
	// extraErrorCode keeps an intent_log error_code when the final event is
	// not a failure.
	extraErrorCode = "legacyErrorCode"
	// extraResult keeps an intent_log result_json when the final event is
	// not terminal.
	extraResult = "legacyResult"
	// extraRenamedPrefix prefixes legacy details keys that collide with
	// Details fields but could not be read into them.
	extraRenamedPrefix = "legacy."
)

// TransportImport names the transport of synthesized events.
const TransportImport = "import"

// limits bound what one legacy row may hold.
type limits struct {
	maxEvents int // per nonce
	maxBytes  int // per JSON column
}

// converter turns legacy rows into events.
type converter struct {
	lim limits
}

// rowError builds a RowError.
func rowError(table, rowID, nonce string, format string, args ...any) *RowError {
	return &RowError{Table: table, RowID: rowID, Nonce: nonce, Err: fmt.Errorf(format, args...)}
}

// legacyEvent is a normalized legacy trace event.
type legacyEvent struct {
	id int64
	ev tracing.Event
}

// convertTrace normalizes one trace row. drop is true for rows the
// migration deletes (dedupe).
func (c *converter) convertTrace(r *traceRow) (le legacyEvent, drop bool, rerr *RowError) {
	id := strconv.FormatInt(r.ID, 10)
	fail := func(format string, args ...any) (legacyEvent, bool, *RowError) {
		return legacyEvent{}, false, rowError(TableTraceEvents, id, r.Nonce, format, args...)
	}
	stage, status := r.Stage.String, r.Status.String
	if !r.Status.Valid {
		// Rows written before status existed carry the stage only.
		status = stage
	}
	for _, l := range [...]struct{ what, v string }{{"stage", stage}, {"status", status}} {
		if len(l.v) > maxIDBytes || !utf8.ValidString(l.v) {
			return fail("%s label is not valid UTF-8 of at most %d bytes", l.what, maxIDBytes)
		}
	}
	st, drop, err := normalizeStage(stage, status)
	if err != nil {
		return fail("%w", err)
	}
	if drop {
		return legacyEvent{}, true, nil
	}
	at, present, err := parseTime(r.Timestamp, epochGuess)
	if err != nil {
		return fail("timestamp: %w", err)
	}
	if !present {
		return fail("timestamp is missing")
	}
	details, err := decodeDetails(r.Details, c.lim.maxBytes)
	if err != nil {
		return fail("%w", err)
	}
	ev := tracing.Event{
		Nonce:      r.Nonce,
		State:      st,
		At:         at,
		From:       r.From.String,
		To:         r.To.String,
		IntentType: r.IntentType.String,
	}
	ev.Details.LegacyStage = legacyLabel(stage, st)
	ev.Details.LegacyStatus = legacyLabel(status, st)
	if err := readDetails(&ev, details); err != nil {
		return fail("details: %w", err)
	}
	if ev.Details.Extra == nil {
		ev.Details.Extra = map[string]any{}
	}
	ev.Details.Extra[ExtraTraceEventID] = r.ID
	return legacyEvent{id: r.ID, ev: ev}, false, nil
}

// readDetails moves the known keys of legacy details into the event and the
// rest into Details.Extra.
func readDetails(ev *tracing.Event, m map[string]any) error {
	if len(m) == 0 {
		return nil
	}
	extra := map[string]any{}
	keep := func(k string, v any) {
		extra[extraRenamedPrefix+k] = v
	}
	for k, v := range m {
		switch k {
		case "transport", "errorCode", "error", "clientTimestamp", "legacyStage", "legacyStatus":
			s, ok := v.(string)
			if !ok || checkText(k, s) != nil || (k == "transport" && len(s) > maxIDBytes) {
				keep(k, v)
				continue
			}
			switch k {
			case "transport":
				ev.Transport = s
			case "errorCode":
				ev.Details.ErrorCode = s
			case "error":
				ev.Details.Error = s
			case "clientTimestamp":
				ev.Details.ClientTimestamp = s
			case "legacyStage":
				// An earlier migration already normalized this row: its
				// labels are the original ones.
				ev.Details.LegacyStage = s
			case "legacyStatus":
				ev.Details.LegacyStatus = s
			}
		case "attempt", "timeoutMs", "latencyMs":
			n, ok := jsonInt(v)
			if !ok {
				keep(k, v)
				continue
			}
			switch k {
			case "attempt":
				ev.Attempt = int(n)
			case "timeoutMs":
				ev.Details.TimeoutMs = n
			case "latencyMs":
				ev.Details.LatencyMs = &n
			}
		case "retryable":
			b, ok := v.(bool)
			if !ok {
				keep(k, v)
				continue
			}
			ev.Details.Retryable = b
		case "owner", "frame", "result", "bus", "nextRetryAt", "retryCount", "leaseOwner", "leaseExpiresAt", "response":
			// Fields the projections and recovery read: never taken from
			// legacy trace details.
			keep(k, v)
		default:
			extra[k] = v
		}
	}
	if len(extra) > 0 {
		ev.Details.Extra = extra
	}
	return nil
}

// jsonInt reads a non-negative integral JSON number.
func jsonInt(v any) (int64, bool) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	if n, err := num.Int64(); err == nil {
		return n, n >= 0 && n <= maxIntValue
	}
	f, err := num.Float64()
	if err != nil || f != math.Trunc(f) || f < 0 || f > maxIntValue {
		return 0, false
	}
	return int64(f), true
}

// buildIntent converts one directory intent: its intent_log row (nil for
// trace events that have none) and its trace rows.
func (c *converter) buildIntent(row *intentRow, nonce string, traces []traceRow) ([]tracing.Event, *RowError) {
	table, rowID := TableTraceEvents, ""
	if row != nil {
		table, rowID = tableIntentLog, strconv.FormatInt(row.ID, 10)
	}
	fail := func(format string, args ...any) ([]tracing.Event, *RowError) {
		return nil, rowError(table, rowID, nonce, format, args...)
	}
	if err := checkID("nonce", nonce); err != nil {
		return fail("%w", err)
	}
	if len(traces) > c.lim.maxEvents {
		return fail("more than %d trace events", c.lim.maxEvents)
	}

	// The intent_log row.
	var (
		logState    tracing.State
		logStatus   string
		requestedAt time.Time
		completedAt time.Time
		hasComplete bool
		result      json.RawMessage
		latency     *int64
	)
	if row != nil {
		logStatus = row.Status.String
		if !row.Status.Valid {
			logStatus = string(tracing.Received)
		}
		var err error
		if logState, err = normalizeStatus(logStatus); err != nil {
			return fail("status: %w", err)
		}
		var present bool
		if requestedAt, present, err = parseTime(row.RequestedAt, epochGuess); err != nil {
			return fail("requested_at: %w", err)
		} else if !present {
			return fail("requested_at is missing")
		}
		if completedAt, hasComplete, err = parseTime(row.CompletedAt, epochGuess); err != nil {
			return fail("completed_at: %w", err)
		}
		if result, err = jsonValue(row.ResultJSON, c.lim.maxBytes); err != nil {
			return fail("result_json: %w", err)
		}
		if n, ok, err := intValue(row.LatencyMs); err != nil {
			return fail("round_trip_latency_ms: %w", err)
		} else if ok {
			latency = &n
		}
		if err := checkText("error_code", row.ErrorCode.String); err != nil {
			return fail("%w", err)
		}
	}

	// The trace, normalized and in (timestamp, id) order.
	var les []legacyEvent
	for i := range traces {
		le, drop, rerr := c.convertTrace(&traces[i])
		if rerr != nil {
			rerr.Nonce = nonce
			return nil, rerr
		}
		if !drop {
			les = append(les, le)
		}
	}
	slices.SortStableFunc(les, func(a, b legacyEvent) int {
		if d := a.ev.At.Compare(b.ev.At); d != 0 {
			return d
		}
		return cmp.Compare(a.id, b.id)
	})

	// Who and what: the intent_log row, else the first trace row that says.
	from, to, intentType := "", "", ""
	if row != nil {
		from, to, intentType = row.From.String, row.To.String, row.IntentType.String
	}
	for _, le := range les {
		from = cmp.Or(from, le.ev.From)
		to = cmp.Or(to, le.ev.To)
		intentType = cmp.Or(intentType, le.ev.IntentType)
	}
	if err := checkIDs("from_beam_id", from, "to_beam_id", to, "intent_type", intentType); err != nil {
		return fail("%w", err)
	}
	if row == nil && len(les) == 0 {
		return fail("no trace events left after normalization")
	}

	var out []tracing.Event
	synth := func(st tracing.State, at time.Time) tracing.Event {
		return tracing.Event{Nonce: nonce, State: st, At: at, Transport: TransportImport,
			Details: tracing.Details{Extra: map[string]any{ExtraSynthesized: true}}}
	}
	if len(les) == 0 || les[0].ev.State != tracing.Received {
		at := requestedAt
		if len(les) > 0 && (at.IsZero() || at.After(les[0].ev.At)) {
			at = les[0].ev.At
		}
		out = append(out, synth(tracing.Received, at))
	}
	prev := tracing.State("")
	if len(out) > 0 {
		prev = tracing.Received
	}
	for _, le := range les {
		st := le.ev.State
		if st == prev && !tracing.CanTransition(prev, st) {
			continue // a repeated acked: nothing to annotate
		}
		if !tracing.CanTransition(prev, st) {
			return nil, rowError(TableTraceEvents, strconv.FormatInt(le.id, 10), nonce,
				"illegal transition %s -> %s (stage %s, status %s)", stateName(prev), st,
				quoteLabel(cmp.Or(le.ev.Details.LegacyStage, string(st))),
				quoteLabel(cmp.Or(le.ev.Details.LegacyStatus, string(st))))
		}
		le.ev.Nonce = nonce
		out = append(out, le.ev)
		prev = st
	}

	// Bring the trace to the intent_log status.
	if row != nil && logState != prev {
		steps, ok := path(prev, logState)
		switch {
		case ok && !prev.Terminal():
			// The row moved on without a trace event (a reconciliation):
			// bridge to it. A finished trace is never extended this way.
			at := out[len(out)-1].At
			if hasComplete && completedAt.After(at) {
				at = completedAt
			}
			for _, st := range steps {
				out = append(out, synth(st, at))
			}
			last := &out[len(out)-1]
			last.Details.LegacyStatus = legacyLabel(logStatus, logState)
		case reached(out, logState):
			// The intent_log row lagged behind its trace; the trace wins.
			last := &out[len(out)-1]
			if last.Details.Extra == nil {
				last.Details.Extra = map[string]any{}
			}
			last.Details.Extra[extraIntentLogStatus] = logStatus
		default:
			return fail("status %s (%s) cannot follow the trace's final state %s", quoteLabel(logStatus), logState, prev)
		}
	}

	// The first event says who and what; the last one carries the outcome.
	first := &out[0]
	first.From, first.To, first.IntentType = from, to, intentType
	first.Details.Owner = tracing.OwnerDirectory
	if row != nil && first.Details.ClientTimestamp == "" {
		if s, ok := row.RequestedAt.(string); ok {
			first.Details.ClientTimestamp = s
		}
	}
	if row != nil {
		last := &out[len(out)-1]
		if last.State == logState && last.Details.LegacyStatus == "" {
			last.Details.LegacyStatus = legacyLabel(logStatus, logState)
		}
		finish(last, result, row.ErrorCode.String, latency)
	}
	return out, nil
}

// finish puts an intent_log row's outcome (result_json, error_code, latency)
// on the final event.
func finish(last *tracing.Event, result json.RawMessage, errorCode string, latency *int64) {
	extra := func(k string, v any) {
		if last.Details.Extra == nil {
			last.Details.Extra = map[string]any{}
		}
		last.Details.Extra[k] = v
	}
	if len(result) > 0 {
		if last.State.Terminal() {
			last.Details.Result = result
		} else {
			extra(extraResult, result)
		}
	}
	if errorCode != "" && last.Details.ErrorCode != errorCode {
		switch {
		case last.State == tracing.Failed || last.State == tracing.DeadLetter || last.State == tracing.Queued:
			if last.Details.ErrorCode == "" {
				last.Details.ErrorCode = errorCode
			} else {
				extra(extraErrorCode, errorCode)
			}
		default:
			extra(extraErrorCode, errorCode)
		}
	}
	if latency != nil && last.Details.LatencyMs == nil && last.State.Terminal() {
		last.Details.LatencyMs = latency
	}
}

// buildMessage converts one beam_messages row into a bus-owned intent.
func (c *converter) buildMessage(r *busRow) ([]tracing.Event, *RowError) {
	nonce := r.nonce()
	fail := func(format string, args ...any) ([]tracing.Event, *RowError) {
		return nil, rowError(TableMessages, r.ID, nonce, format, args...)
	}
	if err := checkIDs("id", r.ID, "nonce", nonce, "sender", r.Sender.String, "recipient", r.Recipient.String,
		"intent", r.Intent.String); err != nil {
		return fail("%w", err)
	}
	status := r.Status.String
	if !r.Status.Valid {
		status = string(tracing.Received)
	}
	st, err := normalizeBusStatus(status)
	if err != nil {
		return fail("status: %w", err)
	}
	var createdAt, deliveredAt, ackedAt, failedAt, nextRetryAt time.Time
	for _, f := range []struct {
		name string
		v    any
		dst  *time.Time
	}{
		{"created_at", r.CreatedAt, &createdAt},
		{"delivered_at", r.DeliveredAt, &deliveredAt},
		{"acked_at", r.AckedAt, &ackedAt},
		{"failed_at", r.FailedAt, &failedAt},
		{"next_retry_at", r.NextRetryAt, &nextRetryAt},
	} {
		t, present, err := parseTime(f.v, epochSeconds)
		if err != nil {
			return fail("%s: %w", f.name, err)
		}
		if present {
			*f.dst = t
		}
	}
	if createdAt.IsZero() {
		return fail("created_at is missing")
	}
	ints := map[string]int64{}
	for _, f := range []struct {
		name string
		v    any
		def  int64
	}{
		{"priority", r.Priority, 0}, {"retry_count", r.RetryCount, 0}, {"max_retries", r.MaxRetries, 5},
	} {
		n, present, err := intValue(f.v)
		if err != nil {
			return fail("%s: %w", f.name, err)
		}
		if !present {
			n = f.def
		}
		ints[f.name] = n
	}
	payload, err := jsonValue(r.Payload, c.lim.maxBytes)
	if err != nil {
		return fail("payload: %w", err)
	}
	if payload == nil {
		payload = json.RawMessage(`{}`)
	}
	response, err := jsonValue(r.Response, c.lim.maxBytes)
	if err != nil {
		return fail("response: %w", err)
	}
	metadata, err := jsonValue(r.Metadata, c.lim.maxBytes)
	if err != nil {
		return fail("metadata: %w", err)
	}
	if err := checkText("error", r.Error.String); err != nil {
		return fail("%w", err)
	}
	if r.TraceID.String != "" {
		if err := checkID("trace_id", r.TraceID.String); err != nil {
			return fail("%w", err)
		}
	}

	received := tracing.Event{
		Nonce: nonce, State: tracing.Received, At: createdAt,
		From: r.Sender.String, To: r.Recipient.String, IntentType: r.Intent.String,
		Transport: "bus",
		Details: tracing.Details{
			Owner: tracing.OwnerBus,
			Bus: &tracing.BusMessage{
				MessageID:  r.ID,
				Payload:    payload,
				Priority:   int(ints["priority"]),
				MaxRetries: int(ints["max_retries"]),
				TraceID:    r.TraceID.String,
				Metadata:   metadata,
			},
		},
	}
	out := []tracing.Event{received}
	// Failures after a recorded delivery went through delivered.
	var steps []tracing.State
	if (st == tracing.Failed || st == tracing.DeadLetter) && !deliveredAt.IsZero() {
		steps, _ = path(tracing.Received, tracing.Delivered)
		steps = append(steps, st)
	} else if st != tracing.Received {
		var ok bool
		if steps, ok = path(tracing.Received, st); !ok {
			return fail("status %s cannot be reached", st)
		}
	}
	firstOf := func(ts ...time.Time) time.Time {
		for _, t := range ts {
			if !t.IsZero() {
				return t
			}
		}
		return createdAt
	}
	retries := int(ints["retry_count"])
	for i, s := range steps {
		ev := tracing.Event{Nonce: nonce, State: s, Transport: "bus"}
		switch s {
		case tracing.Dispatched:
			ev.At = firstOf(deliveredAt)
		case tracing.Delivered:
			ev.At = firstOf(deliveredAt, ackedAt)
		case tracing.Acked:
			ev.At = firstOf(ackedAt, deliveredAt)
			ev.Details.Response = response
		case tracing.Queued:
			ev.At = createdAt
			if !nextRetryAt.IsZero() {
				ev.Details.NextRetryAt = nextRetryAt.UnixMilli()
			}
			ev.Details.Error = r.Error.String
		case tracing.Failed, tracing.DeadLetter:
			ev.At = firstOf(failedAt)
			ev.Details.Error = r.Error.String
			if s == tracing.Failed {
				ev.Details.Response = response
			}
		default:
			ev.At = createdAt
		}
		if prev := out[len(out)-1].At; ev.At.Before(prev) {
			ev.At = prev
		}
		if i < len(steps)-1 {
			ev.Details.Extra = map[string]any{ExtraSynthesized: true}
		} else {
			ev.Details.LegacyStatus = legacyLabel(status, st)
			ev.Details.RetryCount = &retries
		}
		out = append(out, ev)
	}
	if len(steps) == 0 {
		out[0].Details.LegacyStatus = legacyLabel(status, st)
		out[0].Details.RetryCount = &retries
	}
	return out, nil
}

// path returns the shortest sequence of states that leads legally from one
// state to another, excluding from and including to. ok is false when to
// cannot be reached. from == to yields an empty path.
func path(from, to tracing.State) (steps []tracing.State, ok bool) {
	if from == to {
		return nil, true
	}
	parent := map[tracing.State]tracing.State{from: from}
	queue := []tracing.State{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, next := range tracing.States {
			if next == cur || !tracing.CanTransition(cur, next) {
				continue
			}
			if _, seen := parent[next]; seen {
				continue
			}
			parent[next] = cur
			if next == to {
				for s := to; s != from; s = parent[s] {
					steps = append(steps, s)
				}
				slices.Reverse(steps)
				return steps, true
			}
			queue = append(queue, next)
		}
	}
	return nil, false
}

// reached reports whether st occurs in events.
func reached(events []tracing.Event, st tracing.State) bool {
	return slices.ContainsFunc(events, func(e tracing.Event) bool { return e.State == st })
}

// stateName names a state for messages, "(new)" for none.
func stateName(s tracing.State) string {
	if s == "" {
		return "(new)"
	}
	return string(s)
}

// checkIDs checks (name, value) pairs with checkID, in order.
func checkIDs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := checkID(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// checkSequence verifies that events form a legal new sequence for one
// nonce: it starts with received and every step obeys tracing.CanTransition.
func checkSequence(events []tracing.Event) error {
	prev := tracing.State("")
	for i, e := range events {
		if !tracing.CanTransition(prev, e.State) {
			return fmt.Errorf("event %d: illegal transition %s -> %s", i, stateName(prev), e.State)
		}
		prev = e.State
	}
	if len(events) == 0 {
		return fmt.Errorf("no events")
	}
	return nil
}
