package tracing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Projections written behind the log.
//
// A commit must make its events durable before the outcomes they record are
// reported; the projection rows (intent_log, beam_messages, beam_mesh) are
// derived from those events and need not be. So an ordinary commit writes
// only the event rows, and the writer keeps the entries whose rows are not
// written yet in memory (writerState.pend). Every update of one nonce since the last
// write is folded into its entry, so an intent whose events span several
// commits costs one row write instead of one per commit.
//
// The pending rows are written by the same writer, in the transaction of a
// later commit (or one of their own when the writer is idle), when
//   - they are older than Config.ProjectAfter (the rows of intents still
//     open then wait once more, see held) or more than maxPending,
//   - a request of the commit is a Do (its function may read any row),
//   - a reader asked for them (the read barrier, sync), or
//   - the log is closing.
// That transaction also records the projections' high-water mark
// (projection_seq): every event up to it is in the rows. It is the commit's
// last seq, or, when rows are held, the seq before the first event a held
// row lacks; rows written in the same commit may then hold later events. On
// Open, the events after the mark are folded again (catchUp) before the log
// serves, each row skipping the events it already holds (by last_seq): a
// restart after SIGKILL loses no row and folds none twice.
//
// Reads that name one nonce (Intent, State, Message, MessageState,
// HasNonce, MessageNonce, MessageByID, FirstDetails, LastDetails, Trace,
// IntentsByNonce)
// answer from the pending entry when there is one, MeshEnvelope from the
// committed rows the writer keeps in memory (meshLive); every other read of
// the projections first waits for the rows pending at the time of the call
// to be written (sync).

// defaultProjectAfter is how long a projection row may wait in memory
// unless Config.ProjectAfter says otherwise.
const defaultProjectAfter = 100 * time.Millisecond

// maxPending is how many entries may wait before their rows are written
// with the next commit.
const maxPending = 8192

// projectMode says which projection rows a commit writes.
type projectMode uint8

const (
	// projectNone: only the events.
	projectNone projectMode = iota
	// projectDue: the rows are due (by age, or the writer is idle); those
	// of unfinished intents wait once more (see held).
	projectDue
	// projectAll: every pending row.
	projectAll
)

// projectNow says which projection rows the commit of batch writes;
// closing is the writer's last commit.
func (l *Log) projectNow(batch []*request, now time.Time, closing bool) projectMode {
	w := &l.w
	for _, r := range batch {
		if r.fn != nil || r.kind == kindSync {
			return projectAll
		}
	}
	switch {
	case closing || len(w.pend) >= maxPending:
		return projectAll
	case len(w.pend) == 0:
		return projectNone
	case now.Sub(w.pendSince) >= l.cfg.ProjectAfter || len(batch) == 0:
		return projectDue
	}
	return projectNone
}

// held reports whether e's rows wait for a later commit although they are
// due: an intent whose rows are due while it is still open would be written
// now and again once it finishes (an upsert that moves its status index
// entry), so its rows wait, once, for the next due commit, by which time
// most intents have finished and are written once, in their final state.
// Rows already held at the previous commit that wrote rows (their first
// unwritten event is at or before heldMark) are written either way, so no
// row waits more than about twice ProjectAfter; a read barrier, a Do,
// maxPending and Close write every row.
func (w *writerState) held(e *entry) bool {
	return w.hold && !e.row.Status.Terminal() && e.from > w.heldMark
}

// projMark returns the projections' high-water mark after a commit that
// wrote the rows and whose last event is last: last itself, unless rows are
// held, then the seq before the first event any held row lacks. On Open,
// catchUp folds the events after the mark; rows written past it skip the
// events they hold (by last_seq).
func (w *writerState) projMark(last int64) int64 {
	if !w.hold {
		return last
	}
	mark := last
	for _, e := range w.work {
		if e.dirty && e.from > 0 {
			mark = min(mark, e.from-1)
		}
	}
	for nonce, p := range w.pend {
		if w.work[nonce] == nil && p.from > 0 {
			mark = min(mark, p.from-1)
		}
	}
	return mark
}

// takePending marks the pending entries for writing in the current
// transaction: those the batch touched are in the working set already
// (lookup copied them there; flush skips the held ones, which merge puts
// back into pend), the others are copied there unless held.
func (w *writerState) takePending() {
	for nonce, p := range w.pend {
		if e := w.work[nonce]; e != nil {
			e.dirty = true
			continue
		}
		if w.held(p) {
			continue
		}
		e := p.clone()
		e.orig = e.row.Status
		e.dirty = true
		w.work[nonce] = e
	}
}

// hasFunc reports whether a request of batch is a Do with a function.
func hasFunc(batch []*request) bool {
	for _, r := range batch {
		if r.fn != nil {
			return true
		}
	}
	return false
}

// pendingWritten forgets the pending entries after the commit that wrote
// them (and the rows of its own batch): the projections hold every event
// up to mark. Held entries stay (merge adds those of the batch), and the
// time they wait for starts again at now.
func (l *Log) pendingWritten(mark int64, now time.Time) {
	w := &l.w
	if len(w.pend) > 0 {
		l.pmu.Lock()
		if w.hold {
			for nonce, p := range w.pend {
				if e := w.work[nonce]; e != nil && !e.dirty {
					delete(w.pend, nonce)
					if p.msg != nil {
						delete(w.pendIDs, p.msg.ID)
					}
				}
			}
		} else {
			clear(w.pend)
			clear(w.pendIDs)
		}
		w.pendSince = now
		l.pmu.Unlock()
	}
	w.heldMark = w.nextSeq - 1
	l.projSeq.Store(mark)
	l.qmu.Lock()
	if l.projectTimer != nil {
		l.projectTimer.Stop()
		l.projectTimer = nil
	}
	l.projectDue = false
	l.qmu.Unlock()
}

// armProjectTimer, called by the writer with qmu held while it waits for
// work, makes sure that the pending rows are written once they are due
// even if no other request comes.
func (l *Log) armProjectTimer() {
	if len(l.w.pend) == 0 || l.projectTimer != nil {
		return
	}
	d := l.cfg.ProjectAfter - time.Since(l.w.pendSince)
	l.projectTimer = time.AfterFunc(max(d, 0), func() {
		l.qmu.Lock()
		l.projectDue = true
		l.qcond.Signal()
		l.qmu.Unlock()
	})
}

// Sync returns once the projection tables (intent_log, beam_messages,
// beam_mesh) hold every event committed before the call. The log's own
// query methods need no call; a reader of those tables through ReadDB
// calls it first.
func (l *Log) Sync(ctx context.Context) error { return l.sync(ctx) }

// sync is the read barrier: it returns once the projections hold every
// event committed before the call.
func (l *Log) sync(ctx context.Context) error {
	if l.wdb == nil || l.projSeq.Load() >= l.lastSeq.Load() {
		return nil
	}
	r := &request{kind: kindSync, done: make(chan struct{})}
	if err := l.wait(ctx, r); err != nil {
		if errors.Is(err, errClosed) {
			return nil // Close wrote everything
		}
		return fmt.Errorf("write pending projection rows: %w", err)
	}
	return nil
}

// pending returns a copy of nonce's pending entry, or nil when its rows are
// written (or it has none).
func (l *Log) pending(nonce string) *entry {
	if l.wdb == nil {
		return nil
	}
	l.pmu.RLock()
	defer l.pmu.RUnlock()
	if p := l.w.pend[nonce]; p != nil {
		return p.clone()
	}
	return nil
}

// pendingMessage returns a copy of the pending entry of bus message id.
func (l *Log) pendingMessage(id string) *entry {
	if l.wdb == nil {
		return nil
	}
	l.pmu.RLock()
	defer l.pmu.RUnlock()
	if nonce, ok := l.w.pendIDs[id]; ok {
		if p := l.w.pend[nonce]; p != nil {
			return p.clone()
		}
	}
	return nil
}

// catchUp folds the events after the projections' high-water mark into
// them, in one transaction, before the writer starts. Rows that already
// hold an event (their last_seq) skip it.
func (l *Log) catchUp(ctx context.Context) error {
	var mark int64
	var last sql.NullInt64
	if err := l.wdb.GetContext(ctx, &mark, selectProjSeq); err != nil {
		return fmt.Errorf("read projection seq: %w", err)
	}
	if err := l.wdb.GetContext(ctx, &last, `SELECT MAX(seq) FROM intent_trace_events`); err != nil {
		return fmt.Errorf("read last seq: %w", err)
	}
	l.projSeq.Store(max(mark, last.Int64))
	if mark >= last.Int64 {
		return nil
	}
	t0 := time.Now()
	w := &l.w
	w.cache = make(map[string]*entry)
	w.counts = make(map[State]int64, len(States))
	defer w.discard()
	tx, err := l.wdb.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("catch up projections: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	ts := w.bind(ctx, tx)
	rctx, cancel := context.WithCancel(ctx)
	chunks := make(chan *rebuildChunk, 4)
	go l.readLog(rctx, mark, chunks, nil)
	defer func() {
		cancel()
		for range chunks { // wait for the reader to finish
		}
	}()
	var n int64
	for c := range chunks {
		if c.err != nil {
			return fmt.Errorf("catch up projections: %w", c.err)
		}
		for i := range c.events {
			ev := &c.events[i]
			e, err := w.lookup(ts, ev.Nonce)
			if err != nil {
				return fmt.Errorf("catch up projections: %w", err)
			}
			if e != nil && e.row.LastSeq >= ev.Seq {
				continue
			}
			if replaces(e, ev, c.taken[i]) {
				if err := w.dropRows(ts, e); err != nil {
					return fmt.Errorf("catch up projections: %w", err)
				}
				e = nil
			}
			w.fold(e, ev)
			n++
		}
	}
	if err := w.flush(ts); err != nil {
		return fmt.Errorf("catch up projections: %w", err)
	}
	if err := ts.exec(stSetProjSeq, []any{last.Int64}); err != nil {
		return fmt.Errorf("catch up projections: record projection seq: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("catch up projections: commit: %w", err)
	}
	l.logger.Info("folded the events written after the projections", "from", mark+1, "to", last.Int64,
		"events", n, "took", time.Since(t0))
	return nil
}

// fold applies ev to e, the working entry of its nonce (nil for a nonce
// without events, which gets a new entry), and returns the entry.
func (w *writerState) fold(e *entry, ev *Event) *entry {
	if e == nil {
		e = &entry{}
		if ev.Details.Bus != nil {
			e.msg = &MessageRow{}
		}
		if ev.Details.Owner == OwnerMesh {
			e.mesh = &MeshRow{}
		}
		if p := projectionOf(ev.Details.Owner); p != nil {
			e.ext = p.New()
		}
		w.work[ev.Nonce] = e
	}
	e.row.Apply(*ev)
	if e.msg != nil {
		e.msg.Apply(*ev)
	}
	if e.mesh != nil {
		e.mesh.Apply(*ev)
	}
	if e.ext != nil {
		e.ext.Apply(*ev)
	}
	e.dirty = true
	if e.from == 0 {
		e.from = ev.Seq
	}
	return e
}
