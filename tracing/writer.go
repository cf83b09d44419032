package tracing

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
)

type reqKind uint8

const (
	kindAppend reqKind = iota
	kindRebuild
	// kindSync asks the writer to write every pending projection row (a
	// read barrier, see behind.go).
	kindSync
)

// Request lifecycle: a caller may abandon a pending request (context
// cancelled); once the writer has taken it, the caller waits for the result.
const (
	reqPending int32 = iota
	reqTaken
	reqAbandoned
)

type request struct {
	kind    reqKind
	events  []Event
	details string  // encoded details of all events, concatenated
	ends    []int32 // end offset of each event's details in details
	fn      func(tx *sqlx.Tx) error
	ctx     context.Context // Rebuild only
	state   atomic.Int32
	done    chan struct{}
	err     error
	reason  string // rejection reason for metrics
	stats   RebuildStats

	// ops are DoOps's side writes (ops.go); opAnchors the last seq before
	// each, opBase the number of ops recorded before the request's first.
	ops       []Op
	opAnchors []int64
	opBase    int64
	// posFrom and posTo are the log's positions before and after the
	// request (replicate.go); imp is set on an Import (import.go).
	posFrom, posTo int64
	imp            *importReq
	// local says the appender need not wait for the Replicator
	// (directoryOnly).
	local bool
}

func (r *request) detailsOf(i int) string {
	start := int32(0)
	if i > 0 {
		start = r.ends[i-1]
	}
	return r.details[start:r.ends[i]]
}

// entry is the in-memory projection state of one nonce.
type entry struct {
	row   IntentRow
	msg   *MessageRow // nil unless the nonce is a bus message
	mesh  *MeshRow    // nil unless the nonce is a pipeline envelope
	orig  State       // status before the current batch ("" for a new nonce)
	dirty bool        // rows changed since they were last written
	// stored says the rows exist in the database (in the current
	// transaction), so they are updated rather than inserted.
	stored bool
	// from is the seq of the first event folded into the entry since its
	// rows were last written (0: the rows hold every event), see behind.go.
	from int64
	// ext is the row of the projection registered for the nonce's owner
	// (owned.go), nil when it has none.
	ext ProjectedRow
}

func (e *entry) clone() *entry {
	c := *e
	if e.msg != nil {
		m := *e.msg
		c.msg = &m
	}
	if e.mesh != nil {
		m := *e.mesh
		c.mesh = &m
	}
	if e.ext != nil {
		c.ext = e.ext.Clone()
	}
	return &c
}

type snapshot struct {
	nonce string
	prev  *entry // nil: the nonce was new in this request
}

// ovMapMin is the request size above which the overlay is a map.
const ovMapMin = 16

type overlay struct {
	nonce string
	state State
	owner Owner
}

// writerState is owned by the goroutine that writes: the writer goroutine,
// or a caller committing its own request (Log.writing).
type writerState struct {
	nextSeq int64
	// opCount is the number of ops recorded in log_ops (cluster mode).
	opCount  int64
	cache    map[string]*entry // non-terminal nonces, as committed
	maxCache int
	// counts is exact after a rebuild (which sets the gauges from it); after
	// an ordinary Open it holds the open states' counts plus later changes,
	// and the terminal gauges are completed by the deferred count
	// (counts.go), not from here.
	counts map[State]int64

	stmts []*sql.Stmt // see stmts.go

	// seen, during Rebuild only, maps a hash of every nonce folded so far to
	// its first seq: a nonce whose hash is absent has no row yet, so no read
	// is needed, and a present one is read by its key.
	seen     map[uint64]int64
	seenSeed maphash.Seed

	// pend holds the entries whose events are committed but whose
	// projection rows are not written yet (behind.go), pendIDs maps the bus
	// message ids among them to their nonces, pendSince
	// when the oldest of them was committed. Readers outside the writer
	// read pend and pendIDs under Log.pmu; the writer changes them only
	// under it and never changes an entry once it is in pend.
	pend      map[string]*entry
	pendIDs   map[string]string
	pendSince time.Time

	work   map[string]*entry // nonces touched by the current batch
	newIDs map[string]bool   // bus message ids created in the current batch
	// idTaken holds the bus message ids that prefetch looked up in the
	// current batch: true for one that beam_messages holds.
	idTaken map[string]bool
	ids     []any
	absent  map[string]bool // nonces without a row at the start of the batch
	keys    []any
	ov      []overlay
	ovm     map[string]overlay // replaces ov for requests of more than ovMapMin events
	ovBig   map[string]overlay
	reqIDs  []string
	snaps   []snapshot
	args    []any
	deltas  [8]int64

	// gatherWant and gatherFor describe the last round of commits for
	// gather: requests queued at its end plus those it released, and its
	// longest commit.
	gatherWant int
	gatherFor  time.Duration

	// Rows waiting for a multi-row statement: event rows of the batch (the
	// log), then the projection rows written by flush.
	evArgs, insArgs, upsArgs, msgArgs []any
	dirty                             []*entry

	// inserted and updated count the intent_log rows the current
	// transaction wrote (beam_log_projection_rows_written_total).
	inserted, updated int

	// hold, during a commit that writes the rows because they are due,
	// keeps the rows of unfinished intents that were not held before in
	// memory; heldMark is the last seq of the previous commit that wrote
	// rows (behind.go).
	hold     bool
	heldMark int64

	// rows tells which nonces and message ids certainly have no row
	// (rowkeys.go).
	rows rowKeys

	// owned holds the statements prepared on the owners' projections,
	// ownedArgs the rows queued for them (owned.go).
	owned     map[string]*sql.Stmt
	ownedArgs map[*Projection][]any
}

func (w *writerState) prepare(ctx context.Context, db *sqlx.DB) error {
	stmts, err := prepareStmts(ctx, db)
	if err != nil {
		return err
	}
	w.stmts = stmts
	if err := w.prepareOwned(ctx, db); err != nil {
		closeStmts(stmts)
		return err
	}
	w.work = make(map[string]*entry)
	w.newIDs = make(map[string]bool)
	w.idTaken = make(map[string]bool)
	w.absent = make(map[string]bool)
	w.pend = make(map[string]*entry)
	w.pendIDs = make(map[string]string)
	return nil
}

func (w *writerState) closeStmts() {
	closeStmts(w.stmts)
	w.stmts = nil
	w.closeOwned()
}

// bind binds the writer's statements to tx.
func (w *writerState) bind(ctx context.Context, tx *sqlx.Tx) *txStmts {
	return &txStmts{ctx: ctx, tx: tx, stmts: w.stmts}
}

// lookup returns the working entry of nonce for the current batch, loading
// it from the cache or, on a miss, from the database inside the
// transaction. It returns nil for a nonce without events.
func (w *writerState) lookup(ts *txStmts, nonce string) (*entry, error) {
	if e := w.work[nonce]; e != nil {
		return e, nil
	}
	if p := w.pend[nonce]; p != nil {
		e := p.clone()
		e.orig = e.row.Status
		e.dirty = false
		w.work[nonce] = e
		return e, nil
	}
	if c := w.cache[nonce]; c != nil {
		e := c.clone()
		e.orig = e.row.Status
		e.dirty = false
		e.stored = true
		e.from = 0
		w.work[nonce] = e
		return e, nil
	}
	if w.absent[nonce] || !w.rows.mayHaveNonce(nonce) {
		return nil, nil
	}
	e := &entry{stored: true}
	var err error
	if w.seen != nil {
		first, ok := w.seen[maphash.String(w.seenSeed, nonce)]
		if !ok {
			return nil, nil
		}
		err = scanIntent(ts.get(stSelIntentSeq).QueryRow(first), &e.row)
		if err == nil && e.row.Nonce != nonce {
			// Two nonces share a hash: read by nonce (no index yet, so
			// slow, and practically never).
			err = scanIntent(ts.queryRow(`SELECT `+intentCols+` FROM intent_log NOT INDEXED WHERE nonce = ?`, nonce), &e.row)
		}
	} else {
		err = scanIntent(ts.get(stSelIntent).QueryRow(nonce), &e.row)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read intent_log %q: %w", nonce, err)
	}
	m := &MessageRow{}
	err = scanMessage(ts.get(stSelMessage).QueryRow(nonce), m)
	switch {
	case err == nil:
		e.msg = m
	case !errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("read beam_messages %q: %w", nonce, err)
	}
	if e.row.Owner == OwnerMesh {
		if e.mesh, err = readMesh(ts, nonce); err != nil {
			return nil, err
		}
	}
	if err := w.readOwned(ts, e); err != nil {
		return nil, err
	}
	e.orig = e.row.Status
	w.work[nonce] = e
	return e, nil
}

// prefetch reads, with one statement per chunk of nonces, the rows of the
// batch's nonces that are neither in the working set nor in the cache, and
// remembers the nonces that have none, so that validation does not query
// SQLite once per new nonce. A nonce found absent may still get its first
// event from an earlier request of the batch: it is then in the working set,
// which lookup consults first. The bus message ids that those nonces' events
// name are looked up the same way (validateFirst checks that a new
// message's id is unused).
func (w *writerState) prefetch(ts *txStmts, batch []*request) error {
	keys, ids := w.keys[:0], w.ids[:0]
	defer func() {
		clear(keys)
		clear(ids)
		w.keys, w.ids = keys[:0], ids[:0]
	}()
	for _, r := range batch {
		for i := range r.events {
			ev := &r.events[i]
			n := ev.Nonce
			if w.work[n] != nil || w.pend[n] != nil || w.cache[n] != nil || w.absent[n] {
				continue
			}
			w.absent[n] = true
			if w.rows.mayHaveNonce(n) {
				keys = append(keys, n)
			}
			if b := ev.Details.Bus; b != nil && b.MessageID != "" {
				if _, ok := w.idTaken[b.MessageID]; !ok && !w.newIDs[b.MessageID] && w.pendIDs[b.MessageID] == "" {
					w.idTaken[b.MessageID] = false
					if w.rows.mayHaveID(b.MessageID) {
						ids = append(ids, b.MessageID)
					}
				}
			}
		}
	}
	w.rows.lookedUp += len(keys) + len(ids)
	if len(ids) > 0 {
		err := ts.queryMulti(mIDIn, ids, func(rows *sql.Rows) error {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			w.idTaken[id] = true
			return nil
		})
		if err != nil {
			clear(w.idTaken)
			return fmt.Errorf("read beam_messages ids: %w", err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	found := keys[:0:0]
	err := ts.queryMulti(mIntentIn, keys, func(rows *sql.Rows) error {
		e := &entry{stored: true}
		if err := scanIntent(rows, &e.row); err != nil {
			return err
		}
		e.orig = e.row.Status
		delete(w.absent, e.row.Nonce)
		w.work[e.row.Nonce] = e
		found = append(found, e.row.Nonce)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read intent_log rows: %w", err)
	}
	if len(found) == 0 {
		return nil
	}
	err = ts.queryMulti(mMessageIn, found, func(rows *sql.Rows) error {
		m := &MessageRow{}
		if err := scanMessage(rows, m); err != nil {
			return err
		}
		if e := w.work[m.Nonce]; e != nil && e.msg == nil {
			e.msg = m
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read beam_messages rows: %w", err)
	}
	for _, n := range found {
		e := w.work[n.(string)]
		if e == nil {
			continue
		}
		if e.row.Owner == OwnerMesh && e.mesh == nil {
			if e.mesh, err = readMesh(ts, n.(string)); err != nil {
				return err
			}
		}
		if e.ext == nil {
			if err := w.readOwned(ts, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// addKeys adds the keys of the rows about to be inserted for e (rowkeys.go).
func (w *writerState) addKeys(e *entry) {
	w.rows.added.nonces.add(e.row.Nonce)
	if e.msg != nil {
		w.rows.added.ids.add(e.msg.ID)
	}
}

// addEvent queues the log row of ev (first is the nonce's first seq).
func (w *writerState) addEvent(ev *Event, details string, first int64) {
	w.evArgs = eventNV(w.evArgs, ev, details, first)
}

// flushEvents inserts the queued event rows. They are those of the seqs
// assigned last (applyEvents gives each event the next seq as it queues
// its row), so they end at nextSeq-1, and their seqs are the rowids SQLite
// gives them (eventInsertCols): SQLite numbers the rows it appends
// consecutively, so they are all right when the last is. A batch whose
// rowids came out otherwise fails, and with it the transaction.
func (w *writerState) flushEvents(ts *txStmts) error {
	if len(w.evArgs) == 0 {
		return nil
	}
	last := w.nextSeq - 1
	first := last - int64(len(w.evArgs)/eventInsertWidth) + 1
	lastRowID, err := ts.execMulti(mEvents, w.evArgs)
	w.clearEvents()
	if err != nil {
		return fmt.Errorf("insert events: %w", err)
	}
	if lastRowID != last {
		return fmt.Errorf("insert events %d..%d: the last row got seq %d: the table is out of step with the log", first, last, lastRowID)
	}
	return nil
}

// clearEvents empties the queue of event rows.
func (w *writerState) clearEvents() {
	clear(w.evArgs)
	w.evArgs = w.evArgs[:0]
}

// write upserts the projection rows of e one by one (used by Do, whose
// function must see its rows).
func (w *writerState) write(ts *txStmts, e *entry) error {
	if err := w.flushEvents(ts); err != nil {
		return err
	}
	if e.stored {
		w.updated++
		w.args = intentUpdateNV(w.args[:0], &e.row)
		if err := ts.exec(stUpdIntent, w.args); err != nil {
			return fmt.Errorf("write intent_log %q: %w", e.row.Nonce, err)
		}
	} else {
		w.inserted++
		w.addKeys(e)
		w.args = intentNV(w.args[:0], &e.row)
		if _, err := ts.execMulti(mIntentInsert, w.args); err != nil {
			return fmt.Errorf("write intent_log %q: %w", e.row.Nonce, err)
		}
	}
	if e.msg != nil {
		if e.stored {
			w.args = messageUpdateNV(w.args[:0], e.msg)
			if err := ts.exec(stUpdMessage, w.args); err != nil {
				return fmt.Errorf("write beam_messages %q: %w", e.row.Nonce, err)
			}
		} else {
			w.args = messageNV(w.args[:0], e.msg)
			if _, err := ts.execMulti(mMessageInsert, w.args); err != nil {
				return fmt.Errorf("write beam_messages %q: %w", e.row.Nonce, err)
			}
		}
	}
	if e.mesh != nil {
		if err := writeMesh(ts, e.mesh); err != nil {
			return err
		}
	}
	if err := w.queueOwned(e); err != nil {
		return err
	}
	if err := w.flushOwned(ts); err != nil {
		return err
	}
	e.dirty = false
	e.stored = true
	e.from = 0
	return nil
}

// flush writes the queued event rows and every dirty working entry, with
// multi-row statements.
func (w *writerState) flush(ts *txStmts) error {
	if err := w.flushEvents(ts); err != nil {
		return err
	}
	ins, ups, msg := w.insArgs[:0], w.upsArgs[:0], w.msgArgs[:0]
	defer func() {
		clear(ins)
		clear(ups)
		clear(msg)
		w.insArgs, w.upsArgs, w.msgArgs = ins[:0], ups[:0], msg[:0]
	}()
	// Rows go in key order, so that SQLite appends to the tables instead of
	// splitting pages in the middle.
	dirty := w.dirty[:0]
	for _, e := range w.work {
		if e.dirty && !w.held(e) {
			dirty = append(dirty, e)
		}
	}
	slices.SortFunc(dirty, func(a, b *entry) int { return cmp.Compare(a.row.FirstSeq, b.row.FirstSeq) })
	defer func() {
		clear(dirty)
		w.dirty = dirty[:0]
	}()
	for _, e := range dirty {
		if e.stored {
			ups = intentNV(ups, &e.row)
		} else {
			w.addKeys(e)
			ins = intentNV(ins, &e.row)
		}
		if e.msg != nil {
			if e.stored {
				w.args = messageUpdateNV(w.args[:0], e.msg)
				if err := ts.exec(stUpdMessage, w.args); err != nil {
					return fmt.Errorf("write beam_messages %q: %w", e.row.Nonce, err)
				}
			} else {
				msg = messageNV(msg, e.msg)
			}
		}
		if e.mesh != nil {
			if err := writeMesh(ts, e.mesh); err != nil {
				return err
			}
		}
		if err := w.queueOwned(e); err != nil {
			return err
		}
		e.dirty = false
		e.stored = true
		e.from = 0
	}
	w.inserted += len(ins) / intentWidth
	w.updated += len(ups) / intentWidth
	if _, err := ts.execMulti(mIntentInsert, ins); err != nil {
		return fmt.Errorf("insert intent_log rows: %w", err)
	}
	if _, err := ts.execMulti(mIntentUpsert, ups); err != nil {
		return fmt.Errorf("update intent_log rows: %w", err)
	}
	if _, err := ts.execMulti(mMessageInsert, msg); err != nil {
		return fmt.Errorf("insert beam_messages rows: %w", err)
	}
	return w.flushOwned(ts)
}

// merge moves the committed working entries into the cache and the state
// counts, and empties the working set. deltas receives the count changes.
// Entries still dirty (their rows are written behind the log) go to pend
// too, under pmu.
func (w *writerState) merge(pmu *sync.RWMutex, now time.Time) {
	locked := false
	for nonce, e := range w.work {
		if e.dirty {
			if !locked {
				pmu.Lock()
				locked = true
				if len(w.pend) == 0 {
					w.pendSince = now
				}
			}
			w.pend[nonce] = e
			if e.msg != nil {
				w.pendIDs[e.msg.ID] = nonce
			}
		}
		if e.row.Status != e.orig {
			if i := stateIndex(e.orig); i >= 0 {
				w.deltas[i]--
				w.counts[e.orig]--
			}
			if i := stateIndex(e.row.Status); i >= 0 {
				w.deltas[i]++
			}
			w.counts[e.row.Status]++
		}
		e.orig = e.row.Status
		if e.row.Status.Terminal() {
			delete(w.cache, nonce)
		} else if _, ok := w.cache[nonce]; ok || len(w.cache) < w.maxCache {
			w.cache[nonce] = e
		}
	}
	if locked {
		pmu.Unlock()
	}
	clear(w.work)
	clear(w.newIDs)
	clear(w.idTaken)
	clear(w.absent)
}

// discard drops the working set after a failed transaction.
func (w *writerState) discard() {
	w.inserted, w.updated = 0, 0
	clear(w.work)
	clear(w.newIDs)
	clear(w.idTaken)
	clear(w.absent)
	w.clearEvents()
	for p, args := range w.ownedArgs {
		clear(args)
		w.ownedArgs[p] = args[:0]
	}
}

// Append validates the events, hands them to the writer and waits until
// they are committed, then returns them with Seq and At set. The call is
// atomic: all of its events are written or none. Events of one call are
// applied in order, so a call may carry several steps of one nonce.
//
// It returns a *TransitionError when an event's state may not follow the
// nonce's current state, a *ValidationError for a malformed event, and
// errClosed after Close. If ctx ends before the writer has taken the call,
// Append returns ctx.Err() and nothing is written; once the writer has taken
// it, Append waits for the commit and reports its outcome regardless of ctx
// (a commit is normally a few milliseconds).
func (l *Log) Append(ctx context.Context, events ...Event) ([]Event, error) {
	if len(events) == 0 {
		return nil, nil
	}
	return l.submit(ctx, nil, events, nil)
}

// Do is Append plus fn: after the events are written, fn runs inside the
// same transaction, in a savepoint. If fn returns an error (or panics) only
// this call is rejected: its events and fn's writes are rolled back, and Do
// returns a *FuncError wrapping fn's error. fn may be called with no events;
// other components use Do for all of their writes so that the log's
// connection stays the only SQLite writer. fn sees the projection rows of
// this call's events, must not block for long (the whole log waits for it),
// must not retain tx, and must not commit or roll it back.
func (l *Log) Do(ctx context.Context, fn func(tx *sqlx.Tx) error, events ...Event) ([]Event, error) {
	if fn == nil && len(events) == 0 {
		return nil, nil
	}
	return l.submit(ctx, fn, events, nil)
}

// submit appends events with fn or ops (DoOps: fn applies them).
func (l *Log) submit(ctx context.Context, fn func(*sqlx.Tx) error, events []Event, ops []Op) ([]Event, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		l.m.rejected.WithLabelValues(rejectCanceled).Inc()
		return nil, err
	}
	r, err := l.newRequest(events)
	if err != nil {
		l.m.rejected.WithLabelValues(rejectInvalid).Inc()
		return nil, err
	}
	r.fn = fn
	if len(ops) > 0 {
		r.ops = append([]Op(nil), ops...)
		r.opAnchors = make([]int64, len(ops))
		r.fn = func(tx *sqlx.Tx) error { return l.applyOps(tx, r) }
	}
	if err := l.wait(ctx, r); err != nil {
		return nil, err
	}
	l.m.append.Observe(time.Since(start).Seconds())
	return r.events, nil
}

// wait enqueues r and waits for its outcome, or commits r itself when the
// writer is idle (idleLocked).
func (l *Log) wait(ctx context.Context, r *request) error {
	if l.ship != nil {
		if err := l.fencedErr(); err != nil {
			l.m.rejected.WithLabelValues(rejectClosed).Inc()
			return err
		}
	}
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		l.m.rejected.WithLabelValues(rejectClosed).Inc()
		return errClosed
	}
	if l.idleLocked(r) {
		l.writing = true
		l.qmu.Unlock()
		l.commitOwn(r)
	} else {
		l.queue = append(l.queue, r)
		if len(l.queue) == 1 || len(l.queue) >= l.gatherTarget || r.kind == kindRebuild {
			l.qcond.Signal()
		}
		l.qmu.Unlock()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqPending, reqAbandoned) {
			l.m.rejected.WithLabelValues(rejectCanceled).Inc()
			return ctx.Err()
		}
		<-r.done
	}
	if r.err != nil {
		l.m.rejected.WithLabelValues(r.reason).Inc()
		return r.err
	}
	return nil
}

// idleLocked reports whether the caller of wait may commit r itself: the
// writer is idle with nothing queued or due, r is a plain append, and the
// last commit carried one request with none waiting when it ended. One
// request in flight then costs no hand-off to the writer goroutine and
// back, which is most of the scheduler's work per commit when there is
// nothing to batch; under load the writer gathers as before (a caller
// committing alone the moment the queue empties would split its batches).
// qmu is held.
func (l *Log) idleLocked(r *request) bool {
	return !l.writing && len(l.queue) == 0 && !l.projectDue && r.kind == kindAppend &&
		l.w.gatherWant <= 1 && !l.needRestart.Load()
}

// commitOwn commits r, alone, in the caller's goroutine, which has set
// writing; then hands the writer's state back to the writer goroutine,
// waking it if work came meanwhile.
func (l *Log) commitOwn(r *request) {
	r.state.Store(reqTaken)
	l.w.gatherWant, l.w.gatherFor = 0, 0
	l.commitBatch([]*request{r}, false)
	l.ownCommits.Add(1)
	l.qmu.Lock()
	l.writing = false
	if len(l.queue) > 0 || l.closed || l.projectDue {
		l.qcond.Signal()
	} else {
		l.armProjectTimer()
	}
	l.qmu.Unlock()
}

// newRequest copies and checks the events (everything that does not depend
// on the log's state) and encodes their details, in the caller's goroutine.
func (l *Log) newRequest(events []Event) (*request, error) {
	if len(events) > l.cfg.MaxBatch {
		return nil, &ValidationError{Index: l.cfg.MaxBatch, Field: "events",
			Reason: fmt.Sprintf("a call may carry at most %d events, got %d", l.cfg.MaxBatch, len(events))}
	}
	r := &request{
		events: make([]Event, len(events)),
		ends:   make([]int32, len(events)),
		done:   make(chan struct{}),
	}
	copy(r.events, events)
	var buf []byte
	for i := range r.events {
		ev := &r.events[i]
		if err := checkEvent(i, ev); err != nil {
			return nil, err
		}
		if err := ev.Details.normalize(); err != nil {
			return nil, &ValidationError{Nonce: ev.Nonce, Index: i, Field: "details", Reason: err.Error()}
		}
		n := len(buf)
		var err error
		buf, err = ev.Details.appendJSON(buf)
		if err != nil {
			return nil, &ValidationError{Nonce: ev.Nonce, Index: i, Field: "details", Reason: err.Error()}
		}
		if len(buf)-n > maxDetailsBytes {
			return nil, &ValidationError{Nonce: ev.Nonce, Index: i, Field: "details",
				Reason: fmt.Sprintf("encoded details are %d bytes, more than %d", len(buf)-n, maxDetailsBytes)}
		}
		r.ends[i] = int32(len(buf))
		ev.Seq = 0
		if !ev.At.IsZero() {
			ev.At = time.UnixMicro(ev.At.UnixMicro()).UTC()
		}
	}
	r.details = string(buf)
	return r, nil
}

func checkEvent(i int, ev *Event) error {
	bad := func(field, reason string) error {
		n := ev.Nonce
		if len(n) > 64 {
			n = n[:64] + "..."
		}
		return &ValidationError{Nonce: n, Index: i, Field: field, Reason: reason}
	}
	if !ev.State.Valid() {
		return bad("state", fmt.Sprintf("unknown lifecycle state %q", string(ev.State)))
	}
	switch {
	case ev.Nonce == "":
		return bad("nonce", "empty")
	case len(ev.Nonce) > MaxNonceBytes:
		return bad("nonce", fmt.Sprintf("longer than %d bytes", MaxNonceBytes))
	case !utf8.ValidString(ev.Nonce):
		return bad("nonce", "not valid UTF-8")
	}
	for _, f := range [...]struct{ name, v string }{
		{"from", ev.From}, {"to", ev.To}, {"intentType", ev.IntentType}, {"transport", ev.Transport},
	} {
		if len(f.v) > maxFieldBytes {
			return bad(f.name, fmt.Sprintf("longer than %d bytes", maxFieldBytes))
		}
		if !utf8.ValidString(f.v) {
			return bad(f.name, "not valid UTF-8")
		}
	}
	if ev.Attempt < 0 {
		return bad("attempt", "negative")
	}
	switch ev.Details.Owner {
	case "", OwnerDirectory, OwnerBus, OwnerJobs, OwnerMesh:
	default:
		return bad("details.owner", fmt.Sprintf("unknown owner %q", string(ev.Details.Owner)))
	}
	if b := ev.Details.Bus; b != nil && len(b.MessageID) > MaxNonceBytes {
		return bad("details.bus.messageId", fmt.Sprintf("longer than %d bytes", MaxNonceBytes))
	}
	return nil
}

// maxGather bounds how long the writer waits to gather a batch.
const maxGather = time.Millisecond

// gather, called with qmu held and a non-empty queue, waits briefly for
// more requests when fewer are queued than the previous commit suggests:
// callers released by a commit usually append again at once, and without
// the wait every other commit would carry only half of them (one commit's
// fsync costs the same for 1 event or 1000). It waits until the queue holds
// the requests that were queued at the end of the last commit plus those it
// released, for at most half the last commit's duration (and maxGather);
// after a single-request commit, or under light load, it does not wait.
func (l *Log) gather() {
	w := &l.w
	want := min(w.gatherWant, l.cfg.MaxBatch)
	if len(l.queue) >= want || l.closed || w.gatherFor <= 0 || l.queue[len(l.queue)-1].kind == kindRebuild {
		return
	}
	l.gatherGen++
	gen := l.gatherGen
	l.gatherTarget = want
	t := time.AfterFunc(min(w.gatherFor/2, maxGather), func() {
		l.qmu.Lock()
		if l.gatherGen == gen {
			l.gatherTarget = 0
			l.qcond.Signal()
		}
		l.qmu.Unlock()
	})
	for len(l.queue) < l.gatherTarget && !l.closed && l.queue[len(l.queue)-1].kind != kindRebuild {
		l.qcond.Wait()
	}
	l.gatherGen++
	l.gatherTarget = 0
	t.Stop()
}

// run is the writer goroutine: it takes everything pending and commits it
// in batches of at most MaxBatch events until the log is closed and the
// queue is empty.
func (l *Log) run() {
	defer close(l.writerDone)
	var local []*request
	var batch []*request
	held := false
	for {
		l.qmu.Lock()
		// The writer holds writing from taking work until it comes back
		// here; then a caller of wait may commit while the writer waits.
		// Before the first batch a caller may already hold it.
		if held {
			l.writing = false
		}
		for l.writing || len(l.queue) == 0 && !l.closed && !l.projectDue {
			if !l.writing {
				l.armProjectTimer()
			}
			l.qcond.Wait()
		}
		l.writing, held = true, true
		if len(l.queue) == 0 {
			closed := l.closed
			l.projectDue = false
			l.qmu.Unlock()
			// Idle with projection rows due, or closing: write them.
			if len(l.w.pend) > 0 {
				l.commitBatch(nil, closed)
			}
			if closed {
				l.qmu.Lock()
				if l.projectTimer != nil {
					l.projectTimer.Stop()
				}
				l.qmu.Unlock()
				return
			}
			continue
		}
		l.gather()
		local, l.queue = l.queue, local[:0]
		l.qmu.Unlock()
		l.w.gatherWant, l.w.gatherFor = 0, 0
		if l.needRestart.Load() {
			l.needRestart.Store(false)
			l.restartWAL()
		}

		for i := 0; i < len(local); {
			if local[i].kind == kindRebuild {
				r := local[i]
				i++
				if r.state.CompareAndSwap(reqPending, reqTaken) {
					l.runRebuild(r)
				}
				continue
			}
			batch = batch[:0]
			n := 0
			for i < len(local) && local[i].kind != kindRebuild {
				r := local[i]
				if len(batch) > 0 && n+len(r.events) > l.cfg.MaxBatch {
					break
				}
				i++
				if !r.state.CompareAndSwap(reqPending, reqTaken) {
					continue
				}
				batch = append(batch, r)
				n += len(r.events)
			}
			if len(batch) > 0 {
				l.commitBatch(batch, false)
			}
		}
		clear(local)
		clear(batch)
	}
}

func reject(r *request, err error, reason string) {
	r.err = err
	r.reason = reason
}

// commitBatch runs one group-commit transaction for batch (which may be
// empty when only the pending projection rows are due, or closing).
func (l *Log) commitBatch(batch []*request, closing bool) {
	w := &l.w
	t0 := time.Now()
	seq0, op0 := w.nextSeq, w.opCount
	ctx := context.Background()
	mode := l.projectNow(batch, t0, closing)
	w.hold = mode == projectDue
	defer func() { w.hold = false }()
	fail := func(err error) {
		w.discard()
		w.nextSeq, w.opCount = seq0, op0
		l.logger.Error("log batch failed", "requests", len(batch), "err", err)
		l.writeErr.Store(&err)
		for _, r := range batch {
			reject(r, fmt.Errorf("append to log: %w", err), rejectError)
			close(r.done)
		}
	}
	tx, err := l.wdb.BeginTxx(ctx, nil)
	if err != nil {
		fail(fmt.Errorf("begin: %w", err))
		return
	}
	rollback := func() { _ = tx.Rollback() }
	ts := w.bind(ctx, tx)
	taken := false
	if mode == projectAll && hasFunc(batch) {
		// The functions may read any projection row.
		w.takePending()
		taken = true
		if err := w.flush(ts); err != nil {
			rollback()
			fail(err)
			return
		}
	}
	if err := w.prefetch(ts, batch); err != nil {
		rollback()
		fail(err)
		return
	}
	for _, r := range batch {
		if r.kind == kindSync {
			continue
		}
		if err := l.applyRequest(tx, ts, r); err != nil {
			rollback()
			fail(err)
			return
		}
	}
	direct := mode != projectNone
	if direct && !taken {
		w.takePending()
	}
	flush := w.flushEvents
	if direct {
		flush = w.flush
	}
	if err := flush(ts); err != nil {
		rollback()
		fail(err)
		return
	}
	var mark int64
	if direct {
		mark = w.projMark(w.nextSeq - 1)
		if err := ts.exec(stSetProjSeq, append(w.args[:0], mark)); err != nil {
			rollback()
			fail(fmt.Errorf("record projection seq: %w", err))
			return
		}
	}
	if err := tx.Commit(); err != nil {
		fail(fmt.Errorf("commit: %w", err))
		return
	}
	took := time.Since(t0)
	l.ckpt.committed()
	l.qmu.Lock()
	queued := len(l.queue)
	l.qmu.Unlock()
	w.gatherWant = max(w.gatherWant, queued) + len(batch)
	w.gatherFor = max(w.gatherFor, took)

	l.meshLive.update(w.work)
	if direct {
		l.pendingWritten(mark, t0)
	}
	w.merge(&l.pmu, t0)
	l.m.rowsInserted.Add(float64(w.inserted))
	l.m.rowsUpdated.Add(float64(w.updated))
	w.inserted, w.updated = 0, 0
	l.m.pending.Set(float64(len(w.pend)))
	l.m.commit.Observe(took.Seconds()) // after the state above: tests wait for it
	l.addGaugeDeltas(&w.deltas, w.nextSeq-1)
	n := w.nextSeq - seq0
	if n > 0 {
		l.writeErr.Store(nil) // events were written: the log takes writes again
		l.m.appended.Add(float64(n))
		l.m.batch.Observe(float64(n))
		l.lastSeq.Store(w.nextSeq - 1)
		if l.subCount.Load() > 0 {
			committed := make([]Event, 0, n)
			for _, r := range batch {
				if r.err == nil {
					committed = append(committed, r.events...)
				}
			}
			l.publish(committed)
		}
	}
	l.position.Store(w.nextSeq - 1 + w.opCount)
	if l.ship != nil {
		l.ship.enqueue(batch)
		return
	}
	for _, r := range batch {
		close(r.done)
	}
}

// stateOf returns the current state of nonce as seen by the request being
// validated: its own earlier events first, then the batch, cache and
// database.
func (w *writerState) stateOf(ts *txStmts, nonce string) (overlay, bool, error) {
	if w.ovm != nil {
		if o, ok := w.ovm[nonce]; ok {
			return o, true, nil
		}
	} else {
		for i := len(w.ov) - 1; i >= 0; i-- {
			if w.ov[i].nonce == nonce {
				return w.ov[i], true, nil
			}
		}
	}
	e, err := w.lookup(ts, nonce)
	if err != nil || e == nil {
		return overlay{}, false, err
	}
	return overlay{nonce: nonce, state: e.row.Status, owner: e.row.Owner}, true, nil
}

// messageIDTaken reports whether a bus message id is already used.
func (w *writerState) messageIDTaken(ts *txStmts, id string) (bool, error) {
	if w.newIDs[id] || w.pendIDs[id] != "" {
		return true, nil
	}
	if taken, ok := w.idTaken[id]; ok {
		return taken, nil
	}
	if !w.rows.mayHaveID(id) {
		return false, nil
	}
	var nonce string
	err := ts.get(stSelMessageID).QueryRow(id).Scan(&nonce)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read beam_messages id %q: %w", id, err)
	}
	return true, nil
}

// applyRequest validates and writes one request inside the batch
// transaction. A rejected request leaves r.err set and nothing written; the
// returned error is reserved for database failures, which fail the batch.
func (l *Log) applyRequest(tx *sqlx.Tx, ts *txStmts, r *request) error {
	w := &l.w
	r.posFrom, r.opBase = w.nextSeq-1+w.opCount, w.opCount
	if r.imp != nil {
		err := l.applyImport(tx, ts, r)
		r.posTo = w.nextSeq - 1 + w.opCount
		return err
	}
	w.beginRequest(len(r.events))
	// Validation: nothing is written until every event of the request is
	// known to be acceptable.
	if ok, err := w.validateRequest(ts, r); !ok || err != nil {
		w.dropRequestIDs()
		return err
	}
	seqStart := w.nextSeq
	if r.fn != nil {
		// Earlier requests' event rows must not be inside the savepoint.
		if err := w.flushEvents(ts); err != nil {
			return err
		}
		if _, err := tx.Exec(`SAVEPOINT beam_request`); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		w.snaps = w.snaps[:0]
	}
	w.applyEvents(r, l.clock)
	if r.fn != nil {
		if err := w.runDo(tx, ts, r, seqStart); err != nil {
			return err
		}
		if r.err == nil && l.recordOps() {
			w.opCount += int64(len(r.ops))
		}
	}
	r.posTo = w.nextSeq - 1 + w.opCount
	if l.ship != nil {
		r.local = w.directoryOnly(r)
	}
	return nil
}

// directoryOnly reports whether every event of r is of a nonce the
// directory owns and r has no ops: nothing a node must not lose (a
// synchronous intent interrupted with its node fails as retryable), so its
// appender is released at commit while its items ship in order with the
// rest (replicate.go).
func (w *writerState) directoryOnly(r *request) bool {
	if len(r.ops) > 0 || len(r.events) == 0 {
		return false
	}
	for i := range r.events {
		if e := w.work[r.events[i].Nonce]; e == nil || e.row.Owner != OwnerDirectory {
			return false
		}
	}
	return true
}

// beginRequest resets the per-request overlay of states and the message ids
// the request claims.
func (w *writerState) beginRequest(events int) {
	w.ov = w.ov[:0]
	w.ovm = nil
	if events > ovMapMin {
		if w.ovBig == nil {
			w.ovBig = make(map[string]overlay)
		}
		clear(w.ovBig)
		w.ovm = w.ovBig
	}
	w.reqIDs = w.reqIDs[:0]
}

// dropRequestIDs releases the message ids a rejected request claimed.
func (w *writerState) dropRequestIDs() {
	for _, id := range w.reqIDs {
		delete(w.newIDs, id)
	}
}

// validateRequest checks every event of r against the current states (and
// the overlay of r's earlier events). It reports false, after rejecting r,
// when an event is not acceptable; err is a database failure.
func (w *writerState) validateRequest(ts *txStmts, r *request) (bool, error) {
	for i := range r.events {
		ev := &r.events[i]
		o, exists, err := w.stateOf(ts, ev.Nonce)
		if err != nil {
			return false, err
		}
		cur := o.state
		if !CanTransition(cur, ev.State) {
			reject(r, &TransitionError{Nonce: ev.Nonce, From: cur, To: ev.State}, rejectTransition)
			return false, nil
		}
		if !exists {
			o.owner = ev.Details.Owner
			if ok, err := w.validateFirst(ts, r, i); !ok || err != nil {
				return false, err
			}
		}
		// The owner's own table, when it checks events (lifecycle.go).
		if lc, t, ok := ownerStep(o.owner, cur, ev); ok && !lc.Allows(t.From, t.To, t.On) {
			reject(r, &LifecycleError{Lifecycle: lc.Name, Nonce: ev.Nonce, From: t.From, To: t.To, On: t.On}, rejectTransition)
			return false, nil
		}
		o = overlay{nonce: ev.Nonce, state: ev.State, owner: o.owner}
		if w.ovm != nil {
			w.ovm[ev.Nonce] = o
		} else {
			w.ov = append(w.ov, o)
		}
	}
	return true, nil
}

// validateFirst checks the first event of a new nonce: it names its
// parties and type, and a bus message's id is unused (it is then claimed).
func (w *writerState) validateFirst(ts *txStmts, r *request, i int) (bool, error) {
	ev := &r.events[i]
	if ev.From == "" || ev.To == "" || ev.IntentType == "" {
		reject(r, &ValidationError{Nonce: ev.Nonce, Index: i, Field: "from/to/intentType",
			Reason: "the first event of a nonce must carry from, to and intentType"}, rejectInvalid)
		return false, nil
	}
	b := ev.Details.Bus
	if b == nil {
		return true, nil
	}
	if b.MessageID == "" {
		reject(r, &ValidationError{Nonce: ev.Nonce, Index: i, Field: "details.bus.messageId",
			Reason: "empty"}, rejectInvalid)
		return false, nil
	}
	taken, err := w.messageIDTaken(ts, b.MessageID)
	if err != nil {
		return false, err
	}
	if taken {
		reject(r, &ValidationError{Nonce: ev.Nonce, Index: i, Field: "details.bus.messageId",
			Reason: fmt.Sprintf("message id %q is already used by another nonce", b.MessageID)}, rejectInvalid)
		return false, nil
	}
	w.newIDs[b.MessageID] = true
	w.reqIDs = append(w.reqIDs, b.MessageID)
	return true, nil
}

// applyEvents assigns seqs and times to r's events, folds them into the
// working projection rows and queues their rows for insertion.
func (w *writerState) applyEvents(r *request, clock func() time.Time) {
	var now time.Time
	for i := range r.events {
		ev := &r.events[i]
		if ev.At.IsZero() {
			if now.IsZero() {
				now = time.UnixMicro(clock().UnixMicro()).UTC()
			}
			ev.At = now
		}
		ev.Seq = w.nextSeq
		w.nextSeq++
		e := w.work[ev.Nonce]
		if r.fn != nil {
			w.snap(ev.Nonce, e)
		}
		e = w.fold(e, ev)
		w.addEvent(ev, r.detailsOf(i), e.row.FirstSeq)
	}
}

// runDo writes the rows r touched so that its function sees them, runs the
// function inside the request's savepoint and, when it fails, rolls the
// request back (rows, seqs and claimed message ids) and rejects it.
func (w *writerState) runDo(tx *sqlx.Tx, ts *txStmts, r *request, seqStart int64) error {
	if err := w.flushEvents(ts); err != nil {
		return err
	}
	for _, s := range w.snaps {
		if e := w.work[s.nonce]; e != nil && e.dirty {
			if err := w.write(ts, e); err != nil {
				return err
			}
		}
	}
	ferr := callFn(r.fn, tx)
	clear(w.absent) // fn may have written anything
	clear(w.idTaken)
	if ferr == nil {
		if _, err := tx.Exec(`RELEASE beam_request`); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		return nil
	}
	if _, err := tx.Exec(`ROLLBACK TO beam_request`); err != nil {
		return fmt.Errorf("rollback to savepoint after %v: %w", ferr, err)
	}
	if _, err := tx.Exec(`RELEASE beam_request`); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	for i := len(w.snaps) - 1; i >= 0; i-- {
		s := w.snaps[i]
		if s.prev == nil {
			delete(w.work, s.nonce)
		} else {
			w.work[s.nonce] = s.prev
		}
	}
	w.nextSeq = seqStart
	for i := range r.events {
		r.events[i].Seq = 0
	}
	w.dropRequestIDs()
	reject(r, &FuncError{Err: ferr}, rejectFunc)
	return nil
}

// snap records the pre-request state of nonce once per request.
func (w *writerState) snap(nonce string, e *entry) {
	for _, s := range w.snaps {
		if s.nonce == nonce {
			return
		}
	}
	var prev *entry
	if e != nil {
		prev = e.clone()
	}
	w.snaps = append(w.snaps, snapshot{nonce: nonce, prev: prev})
}

func callFn(fn func(*sqlx.Tx) error, tx *sqlx.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn(tx)
}
