package tracing

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"
)

// rebuildFlush is how many events Rebuild folds between two writes of the
// touched projection rows.
const rebuildFlush = 16384

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
	w.discard()
	w.cache = make(map[string]*entry)
	w.counts = make(map[State]int64, len(States))
	stats, err := l.rebuildTx(r.ctx)
	w.discard()
	w.deltas = [8]int64{}
	if err != nil {
		w.cache, w.counts = oldCache, oldCounts
		l.logger.Error("rebuild of the log projections failed", "err", err)
		reject(r, fmt.Errorf("rebuild projections: %w", err), rejectError)
		return
	}
	for i, s := range States {
		l.m.gauges[i].Set(float64(w.counts[s]))
	}
	stats.Duration = time.Since(start)
	r.stats = stats
	l.logger.Info("rebuilt log projections", "events", stats.Events, "intents", stats.Intents,
		"messages", stats.Messages, "duration", stats.Duration)
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
		createIntentLog, createMessages} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return st, fmt.Errorf("recreate projection tables: %w", err)
		}
	}
	ts := w.bind(ctx, tx)
	w.seen = make(map[uint64]struct{})
	w.seenSeed = maphash.MakeSeed()
	defer func() { w.seen = nil }()
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+eventCols+` FROM intent_trace_events ORDER BY seq`)
	if err != nil {
		return st, fmt.Errorf("read log: %w", err)
	}
	defer rows.Close()
	var sc eventScan
	for rows.Next() {
		ev, err := sc.scan(rows, false)
		if err != nil {
			return st, fmt.Errorf("read log: %w", err)
		}
		e, err := w.lookup(ts, ev.Nonce)
		if err != nil {
			return st, err
		}
		if e == nil {
			e = &entry{}
			if ev.Details.Bus != nil {
				e.msg = &MessageRow{}
				st.Messages++
			}
			st.Intents++
			w.work[ev.Nonce] = e
			w.seen[maphash.String(w.seenSeed, ev.Nonce)] = struct{}{}
		}
		e.row.Apply(ev)
		if e.msg != nil {
			e.msg.Apply(ev)
		}
		e.dirty = true
		st.Events++
		if st.Events%rebuildFlush == 0 {
			if err := w.flush(ts); err != nil {
				return st, err
			}
			w.merge()
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("read log: %w", err)
	}
	if err := rows.Close(); err != nil {
		return st, fmt.Errorf("read log: %w", err)
	}
	if err := w.flush(ts); err != nil {
		return st, err
	}
	w.merge()
	for _, q := range []string{indexIntentLog, indexMessages} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return st, fmt.Errorf("index projection tables: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return st, fmt.Errorf("commit: %w", err)
	}
	return st, nil
}
