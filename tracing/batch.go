package tracing

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The shipped batch: one JSON document
//
//	{"v":1,"from":F,"to":T,"items":[item,…]}
//
// carrying, in commit order, every event and op committed after position F
// up to position T. An event item has its position, its original seq and
// every column of its row ("at" in unix microseconds, "details" the stored
// object); an op item has its position, "op" (the kind) and "payload".
// Only this package reads it (Import); the cluster stores it as opaque
// bytes.

const batchVersion = 1

// maxImportBytes bounds a batch Import accepts.
const maxImportBytes = 64 << 20

// batchItem is one event or op of a batch.
type batchItem struct {
	Pos       int64           `json:"pos"`
	Seq       int64           `json:"seq,omitempty"`
	Nonce     string          `json:"nonce,omitempty"`
	State     State           `json:"state,omitempty"`
	At        int64           `json:"at,omitempty"`
	From      string          `json:"from,omitempty"`
	To        string          `json:"to,omitempty"`
	Type      string          `json:"type,omitempty"`
	Transport string          `json:"transport,omitempty"`
	Attempt   int             `json:"attempt,omitempty"`
	Details   json.RawMessage `json:"details,omitempty"`
	Op        string          `json:"op,omitempty"`
	Payload   json.RawMessage `json:"payload,omitempty"`
}

// batchDoc is a decoded batch.
type batchDoc struct {
	V     int         `json:"v"`
	From  int64       `json:"from"`
	To    int64       `json:"to"`
	Items []batchItem `json:"items"`
}

// appendItem appends it, comma separated, to b.
func appendItem(b []byte, it *batchItem) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(it); err != nil {
		// Only invalid raw JSON fails, and the log stores none.
		panic(fmt.Sprintf("encode batch item %d: %v", it.Pos, err))
	}
	if len(b) > 0 {
		b = append(b, ',')
	}
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

func eventItem(pos int64, ev *Event, details string) batchItem {
	return batchItem{Pos: pos, Seq: ev.Seq, Nonce: ev.Nonce, State: ev.State, At: ev.At.UnixMicro(), From: ev.From,
		To: ev.To, Type: ev.IntentType, Transport: ev.Transport, Attempt: ev.Attempt, Details: json.RawMessage(details)}
}

// encodeRequest encodes the events and ops r committed, in their order:
// each op after the events up to its anchor.
func encodeRequest(r *request) []byte {
	var b []byte
	oi, ord := 0, r.opBase
	op := func() {
		ord++
		it := batchItem{Pos: r.opAnchors[oi] + ord, Op: r.ops[oi].Kind, Payload: r.ops[oi].Payload}
		b = appendItem(b, &it)
		oi++
	}
	for i := range r.events {
		ev := &r.events[i]
		for oi < len(r.ops) && r.opAnchors[oi] < ev.Seq {
			op()
		}
		it := eventItem(ev.Seq+ord, ev, r.detailsOf(i))
		b = appendItem(b, &it)
	}
	for oi < len(r.ops) {
		op()
	}
	return b
}

// encodeBatch encodes the items of entries as one batch.
func encodeBatch(buf []byte, entries []*shipEntry) []byte {
	buf = batchHead(buf, entries[0].from, entries[len(entries)-1].to)
	for i, e := range entries {
		if i > 0 && len(e.items) > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, e.items...)
	}
	return append(buf, "]}"...)
}

func batchHead(buf []byte, from, to int64) []byte {
	buf = append(buf, `{"v":1,"from":`...)
	buf = strconv.AppendInt(buf, from, 10)
	buf = append(buf, `,"to":`...)
	buf = strconv.AppendInt(buf, to, 10)
	return append(buf, `,"items":[`...)
}

// encodeDoc encodes a decoded batch again.
func encodeDoc(d *batchDoc) []byte {
	b := batchHead(nil, d.From, d.To)
	var items []byte
	for i := range d.Items {
		items = appendItem(items, &d.Items[i])
	}
	b = append(b, items...)
	return append(b, "]}"...)
}

// decodeBatch decodes and checks a batch: its items' positions rise
// strictly within (from, to], each is an event (nonce, known state, details
// an object) or an op (kind, JSON payload), never both.
func decodeBatch(b []byte) (*batchDoc, error) {
	if len(b) > maxImportBytes {
		return nil, fmt.Errorf("batch: %d bytes, more than %d", len(b), maxImportBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d batchDoc
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	if dec.More() {
		return nil, errors.New("batch: data after the document")
	}
	if d.V != batchVersion {
		return nil, fmt.Errorf("batch: version %d, this binary reads %d", d.V, batchVersion)
	}
	if d.From < 0 || d.To < d.From {
		return nil, fmt.Errorf("batch: bad range %d..%d", d.From, d.To)
	}
	prev := d.From
	for i := range d.Items {
		it := &d.Items[i]
		if it.Pos <= prev || it.Pos > d.To {
			return nil, fmt.Errorf("batch item %d: position %d out of order (after %d, up to %d)", i, it.Pos, prev, d.To)
		}
		prev = it.Pos
		switch {
		case it.Op != "":
			if it.Nonce != "" || it.Seq != 0 || len(it.Details) > 0 || it.State != "" {
				return nil, fmt.Errorf("batch item %d: an op with event fields", i)
			}
			if len(it.Payload) == 0 || !json.Valid(it.Payload) {
				return nil, fmt.Errorf("batch item %d: op %q without a JSON payload", i, it.Op)
			}
		case it.Nonce != "":
			if len(it.Payload) > 0 {
				return nil, fmt.Errorf("batch item %d: an event with a payload", i)
			}
			if !it.State.Valid() {
				return nil, fmt.Errorf("batch item %d: unknown state %q", i, it.State)
			}
			if len(it.Details) == 0 {
				it.Details = json.RawMessage("{}")
			}
			if it.Details[0] != '{' {
				return nil, fmt.Errorf("batch item %d: details are not an object", i)
			}
		default:
			return nil, fmt.Errorf("batch item %d: neither an event nor an op", i)
		}
	}
	return &d, nil
}

// BatchFrom returns the position a batch starts after (the lastSeq of the
// batch before it).
func BatchFrom(batch []byte) (int64, error) {
	const head = `{"v":1,"from":`
	if bytes.HasPrefix(batch, []byte(head)) {
		rest := batch[len(head):]
		if i := bytes.IndexByte(rest, ','); i > 0 {
			if n, err := strconv.ParseInt(string(rest[:i]), 10, 64); err == nil {
				return n, nil
			}
		}
	}
	d, err := decodeBatch(batch)
	if err != nil {
		return 0, err
	}
	return d.From, nil
}

// Unshipped encodes everything committed after position afterSeq — events
// and ops, in commit order — as batches of at most about 512 KiB, and
// calls fn with each and its last position, in order. A node restarting
// in cluster mode ships these (what it committed but had not acknowledged)
// before it serves. fn's error stops it and is returned.
func (l *Log) Unshipped(ctx context.Context, afterSeq int64, fn func(batch []byte, lastSeq int64) error) error {
	tx, err := l.rdb.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("unshipped: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// The ops at or before afterSeq: the last of them has the largest
	// position (seq + id rises with id).
	var opID, opSeq int64
	err = tx.QueryRowContext(ctx, `SELECT id, seq FROM log_ops WHERE seq + id <= ? ORDER BY seq + id DESC LIMIT 1`, afterSeq).
		Scan(&opID, &opSeq)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("unshipped: read ops: %w", err)
	}
	evAfter := afterSeq - opID
	count := opID // ops up to afterSeq
	const page = 512
	type opRow struct {
		id, seq       int64
		kind, payload string
	}
	var evs []batchItem
	var ops []opRow
	evDone, opDone := false, false
	nextEvents := func() error {
		evs = evs[:0]
		rows, err := tx.QueryContext(ctx, `SELECT `+eventCols+` FROM intent_trace_events WHERE seq > ? ORDER BY seq LIMIT ?`, evAfter, page)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var it batchItem
			var details string
			if err := rows.Scan(&it.Seq, &it.Nonce, &it.State, &it.At, &it.From, &it.To, &it.Type, &it.Transport,
				&it.Attempt, &details); err != nil {
				return err
			}
			it.Details = json.RawMessage(details)
			evs = append(evs, it)
			evAfter = it.Seq
		}
		evDone = len(evs) < page
		return rows.Err()
	}
	nextOps := func() error {
		ops = ops[:0]
		rows, err := tx.QueryContext(ctx, `SELECT id, seq, kind, payload FROM log_ops WHERE id > ? ORDER BY id LIMIT ?`, opID, page)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var o opRow
			if err := rows.Scan(&o.id, &o.seq, &o.kind, &o.payload); err != nil {
				return err
			}
			ops = append(ops, o)
			opID = o.id
		}
		opDone = len(ops) < page
		return rows.Err()
	}
	if err := nextEvents(); err != nil {
		return fmt.Errorf("unshipped: read events: %w", err)
	}
	if err := nextOps(); err != nil {
		return fmt.Errorf("unshipped: read ops: %w", err)
	}
	var items []byte
	from, pos := afterSeq, afterSeq
	ei, oi := 0, 0
	emit := func() error {
		if len(items) == 0 {
			return nil
		}
		b := append(batchHead(nil, from, pos), items...)
		b = append(b, "]}"...)
		items = items[:0]
		from = pos
		return fn(b, pos)
	}
	for {
		if ei == len(evs) && !evDone {
			if err := nextEvents(); err != nil {
				return fmt.Errorf("unshipped: read events: %w", err)
			}
			ei = 0
		}
		if oi == len(ops) && !opDone {
			if err := nextOps(); err != nil {
				return fmt.Errorf("unshipped: read ops: %w", err)
			}
			oi = 0
		}
		haveEv, haveOp := ei < len(evs), oi < len(ops)
		switch {
		case !haveEv && !haveOp:
			return emit()
		case haveOp && (!haveEv || ops[oi].seq < evs[ei].Seq):
			o := ops[oi]
			oi++
			count = o.id
			pos = o.seq + o.id
			it := batchItem{Pos: pos, Op: o.kind, Payload: json.RawMessage(o.payload)}
			items = appendItem(items, &it)
		default:
			// A batch ends before an event, never between an event and the
			// ops after it (they are one request's).
			if len(items) >= maxShipBytes {
				if err := emit(); err != nil {
					return err
				}
			}
			it := &evs[ei]
			ei++
			pos = it.Seq + count
			it.Pos = pos
			items = appendItem(items, it)
		}
	}
}
