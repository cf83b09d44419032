package tracing

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// ImportSource names a batch of another log being imported.
type ImportSource struct {
	// Log is the ID of the log the batch was shipped from.
	Log string
	// Node is the node that wrote it.
	Node string
	// StreamSeq is the batch's sequence in the stream; a batch at or below
	// the last one imported from Log is skipped (0: check positions only).
	StreamSeq uint64
}

// ImportResult tells what Import did with a batch.
type ImportResult struct {
	// Events and Ops count what was appended and applied.
	Events, Ops int
	// Skipped counts the items left out: imported before, of a nonce the
	// collision rule leaves to this log, or an op that failed here.
	Skipped int
	// Duplicate says the whole batch had been imported before.
	Duplicate bool
	// Unfinished lists, per owner (bus, jobs, mesh), the nonces of durable
	// items this batch touched that are not finished after it: the items
	// the taker adopts. A later batch may finish one (Finished).
	Unfinished map[Owner][]string
	// Finished lists, per owner, the nonces of durable items this batch
	// touched that are finished after it: the taker serves their reads
	// (a job bus indexes its finished jobs too).
	Finished map[Owner][]string
}

// importReq is the writer's part of an Import.
type importReq struct {
	src ImportSource
	doc *batchDoc
	res ImportResult
}

// importMarker stands for an Import's function so that the writer treats
// the request like a Do (every projection row written first).
func importMarker(*sqlx.Tx) error { return nil }

// Import appends a batch shipped from another log (a node this one took
// over) as this log's own events, with new seqs, keeping each event's
// time, nonce, state, fields and details and adding details.takenOver =
// {"log", "node", "seq"} (seq: the event's seq in its log), and applies
// its ops with their registered functions, in one transaction with the
// record of what was imported from that log, so importing a batch twice
// (or batches that overlap) is a no-op for what was imported. A nonce this
// log has events of already follows the collision rule (docs/ARCHITECTURE.md,
// "Takeover"): the source's events continue a nonce this log imported from
// the same source; a durable item (owner bus, jobs, mesh) replaces the
// projection rows of this log's own directory trace of the nonce (the
// holder's trace of a handed-over attempt; its events stay in the log);
// otherwise this log's trace stands and the source's events of the nonce
// are skipped. An error wrapping ErrNotReplicated comes after the import
// was committed here; importing the batch again then reports it Duplicate,
// with its durable items as they stand.
func (l *Log) Import(ctx context.Context, from ImportSource, batch []byte) (ImportResult, error) {
	if from.Log == "" {
		return ImportResult{}, errors.New("import: no source log")
	}
	if from.Log == l.id {
		return ImportResult{}, errors.New("import: a log cannot import itself")
	}
	doc, err := decodeBatch(batch)
	if err != nil {
		return ImportResult{}, fmt.Errorf("import from log %s: %w", from.Log, err)
	}
	l.imported.Store(true)
	r := &request{kind: kindAppend, done: make(chan struct{}), fn: importMarker,
		imp: &importReq{src: from, doc: doc, res: ImportResult{Unfinished: map[Owner][]string{}, Finished: map[Owner][]string{}}}}
	if err := l.wait(ctx, r); err != nil {
		return ImportResult{}, fmt.Errorf("import from log %s: %w", from.Log, err)
	}
	res := r.imp.res
	if res.Duplicate {
		// Imported before (maybe by a call that then failed to replicate):
		// the batch's durable items as they stand now.
		seen := make(map[string]bool)
		for i := range doc.Items {
			n := doc.Items[i].Nonce
			if n == "" || seen[n] {
				continue
			}
			seen[n] = true
			row, ok, err := l.Intent(ctx, n)
			if err != nil {
				return ImportResult{}, fmt.Errorf("import from log %s: %w", from.Log, err)
			}
			res.list(row, ok)
		}
	}
	return res, nil
}

// list adds a durable item's nonce to Unfinished or Finished.
func (res *ImportResult) list(row IntentRow, ok bool) {
	switch {
	case !ok || !durable(row.Owner):
	case row.Status.Terminal():
		res.Finished[row.Owner] = append(res.Finished[row.Owner], row.Nonce)
	default:
		res.Unfinished[row.Owner] = append(res.Unfinished[row.Owner], row.Nonce)
	}
}

// applyImport writes an Import inside the batch transaction. Database
// failures fail the batch; everything else skips items.
func (l *Log) applyImport(tx *sqlx.Tx, ts *txStmts, r *request) error {
	w := &l.w
	imp := r.imp
	res := &imp.res
	var doneSeq, donePos int64
	err := tx.QueryRow(`SELECT stream_seq, pos FROM log_imports WHERE log = ?`, imp.src.Log).Scan(&doneSeq, &donePos)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read imports: %w", err)
	}
	if imp.src.StreamSeq != 0 && int64(imp.src.StreamSeq) <= doneSeq {
		res.Duplicate = true
		res.Skipped = len(imp.doc.Items)
		return nil
	}
	decided := make(map[string]bool)
	var touched []string
	var details []byte
	last := donePos
	for i := range imp.doc.Items {
		it := &imp.doc.Items[i]
		if it.Pos <= donePos {
			res.Skipped++
			continue
		}
		last = it.Pos
		if it.Op != "" {
			ok, err := l.importOp(tx, ts, r, it)
			if err != nil {
				return err
			}
			if !ok {
				res.Skipped++
			}
			continue
		}
		ev, ok := importedEvent(it, imp.src)
		if !ok {
			l.logger.Warn("import: event skipped: it does not decode", "log", imp.src.Log, "seq", it.Seq)
			res.Skipped++
			continue
		}
		take, seen := decided[ev.Nonce]
		if !seen {
			var err error
			if take, err = l.importNonce(ts, &ev, imp.src.Log); err != nil {
				return err
			}
			decided[ev.Nonce] = take
			if take {
				touched = append(touched, ev.Nonce)
			}
		}
		if !take {
			res.Skipped++
			continue
		}
		if e := w.work[ev.Nonce]; replaces(e, &ev, true) {
			if err := w.dropRows(ts, e); err != nil {
				return err
			}
		}
		n := len(details)
		details, err = ev.Details.appendJSON(details)
		if err != nil {
			res.Skipped++
			continue
		}
		ev.Seq = w.nextSeq
		w.nextSeq++
		e := w.fold(w.work[ev.Nonce], &ev)
		w.addEvent(&ev, string(details[n:]), e.row.FirstSeq)
		r.events = append(r.events, ev)
		r.ends = append(r.ends, int32(len(details)))
		res.Events++
	}
	r.details = string(details)
	for _, n := range touched {
		if e := w.work[n]; e != nil {
			res.list(e.row, true)
		}
	}
	_, err = tx.Exec(`INSERT INTO log_imports(log, node, stream_seq, pos, at) VALUES(?, ?, ?, ?, ?)
		ON CONFLICT(log) DO UPDATE SET node = excluded.node, stream_seq = MAX(stream_seq, excluded.stream_seq),
		  pos = MAX(pos, excluded.pos), at = excluded.at`,
		imp.src.Log, imp.src.Node, int64(imp.src.StreamSeq), last, l.clock().UnixMicro())
	if err != nil {
		return fmt.Errorf("record import: %w", err)
	}
	return nil
}

// importedEvent turns a batch item into the event this log appends.
func importedEvent(it *batchItem, src ImportSource) (Event, bool) {
	ev := Event{Nonce: it.Nonce, State: it.State, At: time.UnixMicro(it.At).UTC(), From: it.From, To: it.To,
		IntentType: it.Type, Transport: it.Transport, Attempt: it.Attempt}
	if err := ev.Details.UnmarshalJSON(it.Details); err != nil {
		return Event{}, false
	}
	if ev.Details.Extra == nil {
		ev.Details.Extra = make(map[string]any, 1)
	}
	ev.Details.Extra[takenOverKey] = map[string]any{"log": src.Log, "node": src.Node, "seq": it.Seq}
	if checkEvent(0, &ev) != nil || ev.Details.normalize() != nil {
		return Event{}, false
	}
	return ev, true
}

// takenOverKey is the details key of an imported event.
const takenOverKey = "takenOver"

// importNonce applies the collision rule to the first event of a nonce in
// an Import: it reports whether the source's events of the nonce are
// imported, after clearing this log's rows of the nonce when they yield.
func (l *Log) importNonce(ts *txStmts, ev *Event, srcLog string) (bool, error) {
	w := &l.w
	e, err := w.lookup(ts, ev.Nonce)
	if err != nil {
		return false, err
	}
	if e == nil && (ev.State != Received || relayedFor(ev)) {
		// A holder's relay of a frame another node handed to it is that
		// node's to retry or answer, not work of the lost log (and a
		// nonce whose start was left out stays out).
		return false, nil
	}
	if e != nil {
		from, err := l.importedFrom(ts, e)
		if err != nil {
			return false, err
		}
		// The source's nonce imported before continues; a durable item
		// over this log's own directory trace (the holder's part of a
		// handed-over attempt) replaces it (applyImport); otherwise this
		// log's trace stands.
		if from != srcLog && !replaces(e, ev, true) {
			return false, nil
		}
	}
	if b := ev.Details.Bus; b != nil && b.MessageID != "" {
		taken, err := w.messageIDTaken(ts, b.MessageID)
		if err != nil || taken {
			return false, err
		}
		w.newIDs[b.MessageID] = true
	}
	return true, nil
}

// relayedFor reports whether ev, the first event of a nonce, is a holder's
// relay of a frame another node of the cluster handed over (its received
// event names that node: details.fromNode).
func relayedFor(ev *Event) bool {
	if ev.Details.Owner != "" && ev.Details.Owner != OwnerDirectory {
		return false
	}
	from, _ := ev.Details.Extra["fromNode"].(string)
	return from != ""
}

// replaces reports whether ev, an imported event (taken) of a durable
// item, starts its nonce afresh over e, this log's directory trace of the
// same nonce: the collision rule, applied alike by Import, Rebuild and the
// catch-up on Open.
func replaces(e *entry, ev *Event, taken bool) bool {
	return e != nil && taken && e.row.Owner == OwnerDirectory && durable(ev.Details.Owner)
}

// hasTakenOver reports whether stored details (string or []byte) carry
// details.takenOver.
func hasTakenOver(v any) bool {
	switch d := v.(type) {
	case string:
		return strings.Contains(d, `"`+takenOverKey+`"`)
	case []byte:
		return bytes.Contains(d, []byte(`"`+takenOverKey+`"`))
	}
	return false
}

// durable reports whether an owner's items must survive a node.
func durable(o Owner) bool { return o == OwnerBus || o == OwnerJobs || o == OwnerMesh }

// importedFrom returns the log a nonce's first event was imported from
// ("" for a nonce of this log's own).
func (l *Log) importedFrom(ts *txStmts, e *entry) (string, error) {
	w := &l.w
	if err := w.flushEvents(ts); err != nil {
		return "", err
	}
	var raw string
	err := ts.queryRow(`SELECT details FROM intent_trace_events WHERE seq = ?`, e.row.FirstSeq).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read event %d: %w", e.row.FirstSeq, err)
	}
	var d Details
	if d.UnmarshalJSON([]byte(raw)) != nil {
		return "", nil
	}
	t, _ := d.Extra[takenOverKey].(map[string]any)
	from, _ := t["log"].(string)
	return from, nil
}

// dropRows deletes the projection rows of e (a directory trace) so that a
// durable item's lifecycle starts afresh under its nonce; its events stay.
func (w *writerState) dropRows(ts *txStmts, e *entry) error {
	if e.stored {
		if _, err := ts.tx.Exec(`DELETE FROM intent_log WHERE first_seq = ?`, e.row.FirstSeq); err != nil {
			return fmt.Errorf("replace rows of %q: %w", e.row.Nonce, err)
		}
		if _, err := ts.tx.Exec(`DELETE FROM beam_messages WHERE nonce = ?`, e.row.Nonce); err != nil {
			return fmt.Errorf("replace rows of %q: %w", e.row.Nonce, err)
		}
	}
	if i := stateIndex(e.orig); i >= 0 {
		w.deltas[i]--
		w.counts[e.orig]--
	}
	delete(w.work, e.row.Nonce)
	return nil
}

// importOp applies one op of an Import in a savepoint of its own: an op
// that fails here is skipped (reported false), not the import.
func (l *Log) importOp(tx *sqlx.Tx, ts *txStmts, r *request, it *batchItem) (bool, error) {
	w := &l.w
	if err := w.flushEvents(ts); err != nil {
		return false, err
	}
	if _, err := tx.Exec(`SAVEPOINT beam_op`); err != nil {
		return false, fmt.Errorf("savepoint: %w", err)
	}
	op := Op{Kind: it.Op, Payload: it.Payload}
	anchor := w.nextSeq - 1
	ferr := callFn(func(tx *sqlx.Tx) error { return l.applyOp(tx, op, anchor, w.opCount+1) }, tx)
	if ferr != nil {
		l.logger.Warn("import: op skipped", "src", r.imp.src.Log, "op", op.Kind, "err", ferr)
		if _, err := tx.Exec(`ROLLBACK TO beam_op`); err != nil {
			return false, fmt.Errorf("rollback to savepoint after %v: %w", ferr, err)
		}
	}
	if _, err := tx.Exec(`RELEASE beam_op`); err != nil {
		return false, fmt.Errorf("release savepoint: %w", err)
	}
	if ferr != nil {
		return false, nil
	}
	if l.recordOps() {
		w.opCount++
	}
	r.ops = append(r.ops, op)
	r.opAnchors = append(r.opAnchors, anchor)
	r.imp.res.Ops++
	return true, nil
}
