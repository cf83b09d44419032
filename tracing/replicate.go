package tracing

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Cluster mode ships every committed writer batch to replicated storage
// before its appenders are released (docs/ARCHITECTURE.md, "The log",
// "Shipping"). A single node has no Replicator and none of this runs.

// ErrNotReplicated is wrapped by the error an appender gets when its
// events or ops were committed to this node's log but the Replicator did
// not accept them: the call was not acknowledged (they may still reach the
// stream with a later batch, which carries every unshipped item first).
var ErrNotReplicated = errors.New("tracing: not replicated")

// ErrFenced is wrapped by a Replicator's error when another node has
// taken this log over (it wrote on the log's subject). The log then
// refuses every append with it and closes Fenced.
var ErrFenced = errors.New("tracing: log fenced: another node took it over")

// Replicator stores the log's committed batches in replicated storage, in
// order. Replicate is called by one goroutine, one call at a time, with
// the encoded items after position BatchFrom(batch) up to lastSeq (both
// positions of this log, see Log.Position). If BatchFrom(batch) is not the
// last position the storage holds, the Replicator fills the gap first with
// Log.Unshipped; a call whose lastSeq the storage already holds returns
// nil. A nil error releases the batch's appenders; an error wrapping
// ErrFenced fences the log. Replicate must not append to the log (its
// appenders wait for it).
type Replicator interface {
	Replicate(ctx context.Context, batch []byte, lastSeq int64) error
}

// maxShipBytes bounds one Replicate call: queued requests are merged into
// calls up to this size (a single larger request goes alone).
const maxShipBytes = 256 << 10

// shipCloseWait bounds how long Close waits for the Replicator to take
// what is queued.
const shipCloseWait = 10 * time.Second

// Schema of the log's own meta data, its recorded ops and what it imported.
const createReplication = `
CREATE TABLE IF NOT EXISTS log_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS log_ops(
  id      INTEGER PRIMARY KEY,
  seq     INTEGER NOT NULL,
  kind    TEXT NOT NULL,
  payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS log_ops_pos ON log_ops(seq + id);
CREATE TABLE IF NOT EXISTS log_imports(
  log        TEXT PRIMARY KEY,
  node       TEXT NOT NULL,
  stream_seq INTEGER NOT NULL,
  pos        INTEGER NOT NULL,
  at         INTEGER NOT NULL
);
`

// newLogID returns a random log ID (128 bits, hex).
func newLogID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("log id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ID returns the log's ID: random, made with the log file and kept in it,
// so a new data directory is a new log ("" for a log opened read-only
// whose file predates IDs).
func (l *Log) ID() string { return l.id }

// loadID creates the log's ID when the file has none and reads it.
func (l *Log) loadID(ctx context.Context) error {
	id, err := newLogID()
	if err != nil {
		return err
	}
	if _, err := l.wdb.ExecContext(ctx, `INSERT OR IGNORE INTO log_meta(key, value) VALUES('id', ?)`, id); err != nil {
		return fmt.Errorf("store log id: %w", err)
	}
	if err := l.wdb.GetContext(ctx, &l.id, `SELECT value FROM log_meta WHERE key = 'id'`); err != nil {
		return fmt.Errorf("read log id: %w", err)
	}
	var n sql.NullInt64
	if err := l.wdb.GetContext(ctx, &n, `SELECT MAX(id) FROM log_ops`); err != nil {
		return fmt.Errorf("read op count: %w", err)
	}
	l.w.opCount = n.Int64
	var imports int
	if err := l.wdb.GetContext(ctx, &imports, `SELECT COUNT(*) FROM log_imports`); err != nil {
		return fmt.Errorf("read imports: %w", err)
	}
	l.imported.Store(imports > 0)
	return nil
}

// Position returns the log's shipping position: the number of the last
// committed event (its seq) plus the number of ops recorded so far. Every
// committed request moves it; Replicate's lastSeq and Unshipped's afterSeq
// are positions.
func (l *Log) Position() int64 { return l.position.Load() }

// Fenced is closed once a Replicator reported ErrFenced: the log refuses
// every append since; the server restarts with a new log.
func (l *Log) Fenced() <-chan struct{} { return l.fencedCh }

// shipEntry is one committed request waiting for the Replicator.
type shipEntry struct {
	r        *request // the appender to release; nil once answered
	src      *request // what to encode (r, or a copy for one released at commit)
	from, to int64    // positions before and after the request
	items    []byte   // the request's encoded items, comma separated
}

// shipper hands committed requests to the Replicator in commit order, in
// its own goroutine, so that the writer commits the next batch while one
// replicates.
type shipper struct {
	l    *Log
	rep  Replicator
	mu   sync.Mutex
	cond *sync.Cond
	// queue holds committed requests not yet accepted by the Replicator,
	// in commit order; failed ones stay (answered) until a later call
	// carries them.
	queue   []*shipEntry
	closing bool
	fenced  error
	done    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	// retryAfter is the wait before the next call after a failure.
	retryAfter time.Duration
}

func newShipper(l *Log, rep Replicator) *shipper {
	s := &shipper{l: l, rep: rep, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run()
	return s
}

// needsShip reports whether r's appender waits for the Replicator: it
// committed events or ops.
func needsShip(r *request) bool {
	return r.err == nil && r.kind == kindAppend && (len(r.events) > 0 || len(r.ops) > 0)
}

// enqueue takes a committed batch: requests that committed nothing to ship
// are answered at once, the others wait for the Replicator.
func (s *shipper) enqueue(batch []*request) {
	s.mu.Lock()
	fenced := s.fenced
	for _, r := range batch {
		if !needsShip(r) {
			close(r.done)
			continue
		}
		if fenced != nil {
			// Committed here, never to be acknowledged: the log is taken over.
			reject(r, fmt.Errorf("%w: %w", ErrNotReplicated, fenced), rejectError)
			close(r.done)
			continue
		}
		e := &shipEntry{r: r, src: r, from: r.posFrom, to: r.posTo}
		if r.local {
			// Released now: the encoding reads a copy of the events (the
			// caller owns r.events from here; details and ops stay r's).
			e.src = &request{events: slices.Clone(r.events), details: r.details, ends: r.ends, opBase: r.opBase}
			e.r = nil
			close(r.done)
		}
		s.queue = append(s.queue, e)
	}
	s.cond.Signal()
	s.mu.Unlock()
}

// close stops the shipper after it tried once more to ship what is queued
// (for at most wait); appenders still waiting then get ErrNotReplicated.
func (s *shipper) close(wait time.Duration) {
	s.mu.Lock()
	s.closing = true
	s.cond.Signal()
	s.mu.Unlock()
	t := time.AfterFunc(wait, s.cancel)
	<-s.done
	t.Stop()
	s.cancel()
}

func (s *shipper) run() {
	defer close(s.done)
	var buf []byte
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.cond.Wait()
		}
		if len(s.queue) == 0 || s.fenced != nil {
			s.failAll(errClosed)
			s.mu.Unlock()
			return
		}
		// Take queued entries up to maxShipBytes (at least one).
		n, size := 0, 0
		for _, e := range s.queue {
			if e.items == nil {
				e.items = encodeRequest(e.src)
			}
			if n > 0 && size+len(e.items) > maxShipBytes {
				break
			}
			n++
			size += len(e.items) + 1
		}
		take := s.queue[:n]
		closing := s.closing
		s.mu.Unlock()

		buf = encodeBatch(buf[:0], take)
		last := take[len(take)-1].to
		t0 := time.Now()
		err := callReplicate(s.ctx, s.rep, buf, last)
		s.l.m.shipTook.Observe(time.Since(t0).Seconds())

		s.mu.Lock()
		if err == nil {
			for _, e := range take {
				if e.r != nil {
					close(e.r.done)
					e.r = nil
				}
			}
			clear(s.queue[:n])
			s.queue = append(s.queue[:0], s.queue[n:]...)
			s.retryAfter = 0
			s.mu.Unlock()
			continue
		}
		s.l.m.shipFailed.Inc()
		s.l.logger.Warn("log batch not replicated", "requests", n, "lastSeq", last, "err", err)
		if errors.Is(err, ErrFenced) {
			s.fenced = err
			s.l.fence(err)
			s.failAll(err)
			s.mu.Unlock()
			return
		}
		// The entries stay queued (their items go with the next call, in
		// order); their appenders are told now.
		for _, e := range take {
			if e.r != nil {
				reject(e.r, fmt.Errorf("%w: %w", ErrNotReplicated, err), rejectError)
				close(e.r.done)
				e.r = nil
			}
		}
		if closing {
			s.failAll(err)
			s.mu.Unlock()
			return
		}
		s.retryAfter = min(max(2*s.retryAfter, 50*time.Millisecond), 2*time.Second)
		wait := s.retryAfter
		s.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-s.ctx.Done():
		}
	}
}

// failAll answers every queued appender with err and empties the queue.
// s.mu is held.
func (s *shipper) failAll(err error) {
	for _, e := range s.queue {
		if e.r != nil {
			reject(e.r, fmt.Errorf("%w: %w", ErrNotReplicated, err), rejectError)
			close(e.r.done)
			e.r = nil
		}
	}
	clear(s.queue)
	s.queue = s.queue[:0]
}

func callReplicate(ctx context.Context, rep Replicator, batch []byte, last int64) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("replicator panic: %v", p)
		}
	}()
	return rep.Replicate(ctx, batch, last)
}

// fence records that the log was taken over: appends fail fast from now.
func (l *Log) fence(err error) {
	l.fenceOnce.Do(func() {
		l.fenceErr.Store(&err)
		close(l.fencedCh)
		l.logger.Error("this node's log was taken over by another node; it acknowledges nothing more", "log", l.id, "err", err)
	})
}

// fencedErr returns the fence error, nil while the log is not fenced.
func (l *Log) fencedErr() error {
	if p := l.fenceErr.Load(); p != nil {
		return fmt.Errorf("%w: %w", ErrNotReplicated, *p)
	}
	return nil
}
