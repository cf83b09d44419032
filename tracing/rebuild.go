package tracing

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"time"
)

// rebuildFlush is how many events Rebuild folds between two writes of the
// touched projection rows.
const rebuildFlush = 65536

// RebuildStats reports what Rebuild did.
type RebuildStats struct {
	// Events is the number of log events folded.
	Events int64
	// Intents and Messages are the rows written to intent_log and
	// beam_messages.
	Intents  int64
	Messages int64
	// Duration is the time the rebuild took inside the writer.
	Duration time.Duration
}

// Rebuild drops intent_log and beam_messages and folds the whole log into
// them again, in seq order, with the same fold the appender uses. It runs
// inside the writer, in one transaction, so no append interleaves and a
// failed rebuild leaves the old projections in place; appends wait while it
// runs. The log is streamed, and rows are written in batches. Afterwards the
// in-memory cache and the state gauges are reloaded.
func (l *Log) Rebuild(ctx context.Context) (RebuildStats, error) {
	if err := ctx.Err(); err != nil {
		return RebuildStats{}, err
	}
	r := &request{kind: kindRebuild, ctx: ctx, done: make(chan struct{})}
	if err := l.wait(ctx, r); err != nil {
		return RebuildStats{}, err
	}
	return r.stats, nil
}

func (l *Log) runRebuild(r *request) {
	defer close(r.done)
	w := &l.w
	start := time.Now()
	oldCache, oldCounts := w.cache, w.counts
	// The rebuild folds every committed event, those of the pending rows
	// too; it must not read them as rows.
	oldPend, oldIDs := w.pend, w.pendIDs
	l.pmu.Lock()
	w.pend, w.pendIDs = make(map[string]*entry), make(map[string]string)
	l.pmu.Unlock()
	w.discard()
	w.cache = make(map[string]*entry)
	w.counts = make(map[State]int64, len(States))
	stats, err := l.rebuildTx(r.ctx)
	w.discard()
	l.meshLive.reset()
	w.deltas = [8]int64{}
	if err != nil {
		l.pmu.Lock()
		w.pend, w.pendIDs = oldPend, oldIDs
		l.pmu.Unlock()
		w.cache, w.counts = oldCache, oldCounts
		l.logger.Error("rebuild of the log projections failed", "err", err)
		reject(r, fmt.Errorf("rebuild projections: %w", err), rejectError)
		return
	}
	w.hold = false
	l.pendingWritten(w.nextSeq-1, start)
	l.m.pending.Set(0)
	l.setGauges(w.counts)
	stats.Duration = time.Since(start)
	r.stats = stats
	l.logger.Info("rebuilt log projections", "events", stats.Events, "intents", stats.Intents,
		"messages", stats.Messages, "duration", stats.Duration)
}

// rebuildChunk is a slice of the log handed from Rebuild's reader goroutine
// to the writer.
type rebuildChunk struct {
	events []Event
	firsts []int64 // intent_trace_events.first_seq of each event
	// taken says an event of a durable owner was imported (import.go).
	taken []bool
	err   error
}

const rebuildChunkEvents = 4096

// readLog streams the log after seq afterSeq in seq order from the read
// pool, decoding only what the folds read, in chunks sent to out; free
// (which may be nil) returns used chunks.
// It runs in its own goroutine, so that reading and decoding overlap with
// the fold and the writes. The read transaction's snapshot holds every
// committed event, since the writer (running the rebuild) is the only one
// who appends.
func (l *Log) readLog(ctx context.Context, afterSeq int64, out chan<- *rebuildChunk, free chan *rebuildChunk) {
	defer close(out)
	send := func(c *rebuildChunk) bool {
		select {
		case out <- c:
			return true
		case <-ctx.Done():
			return false
		}
	}
	conn, err := l.rdb.Conn(ctx)
	if err != nil {
		send(&rebuildChunk{err: fmt.Errorf("read log: %w", err)})
		return
	}
	defer conn.Close()
	// The driver's rows are read directly: database/sql's Scan would copy
	// every value once more.
	err = conn.Raw(func(dc any) error {
		q, ok := dc.(driver.QueryerContext)
		if !ok {
			return fmt.Errorf("driver connection %T cannot query", dc)
		}
		rows, err := q.QueryContext(ctx, `SELECT `+eventCols+`, first_seq FROM intent_trace_events WHERE seq > ? ORDER BY seq`,
			[]driver.NamedValue{{Ordinal: 1, Value: afterSeq}})
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := make([]driver.Value, 11)
		c := &rebuildChunk{}
		for {
			err := rows.Next(dest)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if len(c.events) == rebuildChunkEvents {
				if !send(c) {
					return ctx.Err()
				}
				select {
				case c = <-free:
					c.events, c.firsts, c.taken = c.events[:0], c.firsts[:0], c.taken[:0]
				default:
					c = &rebuildChunk{}
				}
			}
			c.events = append(c.events, Event{})
			first, err := scanFoldRow(dest, &c.events[len(c.events)-1])
			if err != nil {
				return err
			}
			c.firsts = append(c.firsts, first)
			ev := &c.events[len(c.events)-1]
			c.taken = append(c.taken, durable(ev.Details.Owner) && hasTakenOver(dest[9]))
		}
		if len(c.events) > 0 {
			send(c)
		}
		return nil
	})
	if err != nil {
		send(&rebuildChunk{err: fmt.Errorf("read log: %w", err)})
	}
}

// scanFoldRow fills ev from one driver row (eventCols, first_seq),
// decoding only what the folds read, and returns first_seq.
func scanFoldRow(v []driver.Value, ev *Event) (int64, error) {
	var err error
	ints := func(i int) int64 {
		n, ok := v[i].(int64)
		if !ok && err == nil {
			err = fmt.Errorf("column %d: %T is not an integer", i, v[i])
		}
		return n
	}
	strs := func(i int) string {
		switch x := v[i].(type) {
		case string:
			return x
		case []byte:
			return string(x)
		case nil:
			return ""
		}
		if err == nil {
			err = fmt.Errorf("column %d: %T is not text", i, v[i])
		}
		return ""
	}
	*ev = Event{
		Seq: ints(0), Nonce: strs(1), State: stateOf(strs(2)), At: time.UnixMicro(ints(3)).UTC(),
		From: strs(4), To: strs(5), IntentType: strs(6), Transport: strs(7), Attempt: int(ints(8)),
	}
	details := strs(9)
	first := ints(10)
	if err != nil {
		return 0, fmt.Errorf("event %d: %w", ev.Seq, err)
	}
	if err := ev.Details.decodeFoldString(details); err != nil {
		return 0, fmt.Errorf("event %d: %w", ev.Seq, err)
	}
	return first, nil
}

// stateOf returns the canonical State named s, so that events share the
// constants' memory.
func stateOf(s string) State {
	for _, st := range States {
		if string(st) == s {
			return st
		}
	}
	return State(s)
}

func (l *Log) rebuildTx(ctx context.Context) (RebuildStats, error) {
	var st RebuildStats
	w := &l.w
	tx, err := l.wdb.BeginTxx(ctx, nil)
	if err != nil {
		return st, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, q := range []string{`DROP TABLE IF EXISTS intent_log`, `DROP TABLE IF EXISTS beam_messages`,
		`DROP TABLE IF EXISTS beam_mesh`, createIntentLog, createMessages, createMesh} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return st, fmt.Errorf("recreate projection tables: %w", err)
		}
	}
	ts := w.bind(ctx, tx)
	if err := recreateOwned(ctx, ts); err != nil {
		return st, err
	}
	w.seen = make(map[uint64]int64)
	w.seenSeed = maphash.MakeSeed()
	defer func() { w.seen = nil }()

	rctx, cancel := context.WithCancel(ctx)
	chunks := make(chan *rebuildChunk, 4)
	free := make(chan *rebuildChunk, 4)
	go l.readLog(rctx, 0, chunks, free)
	defer func() {
		cancel()
		for range chunks { // wait for the reader to finish
		}
	}()
	var fixes [][2]int64 // seq, first_seq of events whose stored first_seq is wrong
	for c := range chunks {
		if c.err != nil {
			return st, c.err
		}
		for i := range c.events {
			ev := &c.events[i]
			e, err := w.lookup(ts, ev.Nonce)
			if err != nil {
				return st, err
			}
			if replaces(e, ev, c.taken[i]) {
				if err := w.dropRows(ts, e); err != nil {
					return st, err
				}
				e = nil
			}
			if e == nil {
				if ev.Details.Bus != nil {
					st.Messages++
				}
				st.Intents++
				w.seen[maphash.String(w.seenSeed, ev.Nonce)] = ev.Seq
			}
			e = w.fold(e, ev)
			if c.firsts[i] != e.row.FirstSeq {
				fixes = append(fixes, [2]int64{ev.Seq, e.row.FirstSeq})
			}
			st.Events++
			if st.Events%rebuildFlush == 0 {
				if err := w.flush(ts); err != nil {
					return st, err
				}
				w.merge(&l.pmu, time.Now())
			}
		}
		clear(c.events) // drop references before reuse
		select {
		case free <- c:
		default:
		}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if err := w.flush(ts); err != nil {
		return st, err
	}
	w.merge(&l.pmu, time.Now())
	if len(fixes) > 0 {
		// The log's grouping column disagrees with the fold (it was written
		// by hand or damaged): repair it so that Trace finds every event.
		l.logger.Warn("rebuild repairs intent_trace_events.first_seq", "events", len(fixes))
		for _, f := range fixes {
			if _, err := tx.ExecContext(ctx, `UPDATE intent_trace_events SET first_seq = ? WHERE seq = ?`, f[1], f[0]); err != nil {
				return st, fmt.Errorf("repair first_seq of event %d: %w", f[0], err)
			}
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE projection_seq SET seq = (SELECT COALESCE(MAX(seq), 0) FROM intent_trace_events)`); err != nil {
		return st, fmt.Errorf("record projection seq: %w", err)
	}
	for _, q := range []string{indexIntentLog, indexMessages, indexMesh} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return st, fmt.Errorf("index projection tables: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return st, fmt.Errorf("commit: %w", err)
	}
	return st, nil
}
