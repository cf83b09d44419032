package tracing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/internal/dirlock"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Config configures Open.
type Config struct {
	// Path is the SQLite file; it is created when missing.
	Path string
	// Synchronous is the SQLite synchronous mode of the write connection:
	// "FULL" (default: a commit is durable when Append returns), "NORMAL" or
	// "OFF".
	Synchronous string
	// Clock stamps events whose At is zero. Default time.Now.
	Clock func() time.Time
	// Logger receives operational messages. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the log's metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// MaxBatch is the most events committed in one transaction; it is also
	// the most events one Append or Do call may carry. Default 2048.
	MaxBatch int
	// ReadConns is the size of the read-only connection pool. Default 4.
	ReadConns int
	// MaxCachedIntents bounds the in-memory cache of non-terminal intent
	// rows (default 262144). Nonces beyond it are read from SQLite when
	// touched; correctness does not depend on the cache.
	MaxCachedIntents int
	// ProjectAfter is the longest a projection row waits in memory before
	// it is written behind its events (behind.go). Default 100 ms.
	ProjectAfter time.Duration
	// Replicator, in cluster mode, stores every committed batch in
	// replicated storage before its appenders are released
	// (replicate.go). Nil on a single node: nothing is shipped.
	Replicator Replicator
}

// Limits on what one event may carry.
const (
	// MaxNonceBytes is the longest nonce accepted.
	MaxNonceBytes = 256
	// maxFieldBytes bounds From, To, IntentType and Transport.
	maxFieldBytes = 1024
	// maxDetailsBytes bounds one event's encoded details.
	maxDetailsBytes = 1 << 20
	// maxTraceEvents is the most events Trace returns for one nonce.
	maxTraceEvents = 10000
)

// writerBusyTimeout is how long a write waits for a lock another process
// holds on the database before it fails: short enough that a request
// waiting for it is answered within a client's usual 10 s timeout (the
// Intent Protocol SDK's), with 503 for it to retry.
const writerBusyTimeout = 5 * time.Second

// writerLockSuffix names the file, beside the database, whose lock the
// writer holds.
const writerLockSuffix = "-writer.lock"

// SQLite's page caches, per connection. Each connection keeps its own, and
// they fill with whatever pages it touched until they reach their cap, so
// with a large database the caps are memory the process holds for good: in
// all, the writer's plus ReadConns readers'. The writer appends at the right
// edge of its B-trees and updates rows of recent intents, so its hot pages
// are few; the readers' queries go through indexes to a few pages each.
// Pages beyond the caps are read from the operating system's file cache.
// Larger caps (64 MiB and 4 × 16 MiB) were measured no faster on any bench
// path and held ~1.4 KB more per idle agent (the history of docs/BENCHMARKS.md).
const (
	writerCacheKiB = 8 << 10
	readerCacheKiB = 2 << 10
)

// Log is the append-only event log and its projections in one SQLite file.
// It is safe for concurrent use. All writes go through one goroutine that
// owns the only write connection.
type Log struct {
	cfg    Config
	clock  func() time.Time
	logger *slog.Logger
	wdb    *sqlx.DB
	rdb    *sqlx.DB
	reads  *readStmts
	m      *metrics
	// writerLock is held while the log is open for writing (Open): one
	// writer per log file. Nil for OpenReadOnly.
	writerLock *dirlock.Lock

	qmu    sync.Mutex
	qcond  *sync.Cond
	queue  []*request
	closed bool
	// gatherTarget is the queue length the gathering writer waits for (0:
	// it is not gathering); gatherGen tells its deadline timers apart.
	gatherTarget int
	gatherGen    uint64
	// writing says a goroutine holds the writer's state and connection: the
	// writer goroutine with a batch, or an appender that found the writer
	// idle and commits its own request (see wait).
	writing bool

	writerDone chan struct{}
	// ckpt runs the WAL checkpoints; needRestart asks the writer to
	// restart the WAL (checkpoint.go).
	ckpt        *checkpointer
	needRestart atomic.Bool
	// imported is set once the log imports another log (Imported).
	imported    atomic.Bool
	walRestarts atomic.Int64 // for tests
	ownCommits  atomic.Int64 // commits made by a caller of wait, for tests
	closeOnce   sync.Once
	closeErr    error

	// Owned by whoever has set writing (and by Open before the writer
	// starts).
	w writerState
	// pmu guards w.pend and w.pendIDs for readers (behind.go); projSeq is
	// the projections' high-water mark; projectDue and projectTimer (under
	// qmu) wake the idle writer when pending rows are due.
	pmu          sync.RWMutex
	projSeq      atomic.Int64
	projectDue   bool
	projectTimer *time.Timer
	// meshLive holds the open envelopes' beam_mesh rows (mesh_live.go).
	meshLive meshLive

	lastSeq atomic.Int64
	// id is the log's ID (replicate.go); position its shipping position;
	// ship, in cluster mode, hands committed batches to the Replicator;
	// fencedCh is closed, and fenceErr set, once the log was taken over.
	id        string
	position  atomic.Int64
	ship      *shipper
	fencedCh  chan struct{}
	fenceOnce sync.Once
	fenceErr  atomic.Pointer[error]
	// writeErr is the error of the writer's last failed batch, cleared by
	// the next batch that commits events (see WriteErr).
	writeErr atomic.Pointer[error]

	subMu    sync.Mutex
	subs     map[*Subscription]struct{}
	subCount atomic.Int64
	subsDone bool
	subWG    sync.WaitGroup

	// countMu guards tc and the order of updates to the state gauges
	// (counts.go).
	countMu sync.Mutex
	tc      terminalCounts

	// keyScan stops the row key scan and waits for it (rowkeys.go).
	keyScan func()
}

var bindOnce sync.Once

// Open opens or creates the log at cfg.Path, creates the schema, loads the
// cache of non-terminal intents (without folding the log) and starts the
// writer.
func Open(ctx context.Context, cfg Config) (*Log, error) {
	bindOnce.Do(func() { sqlx.BindDriver("sqlite", sqlx.QUESTION) })
	if cfg.Path == "" {
		return nil, errors.New("open log: empty path")
	}
	if strings.ContainsRune(cfg.Path, '?') {
		return nil, fmt.Errorf("open log: path %q must not contain '?'", cfg.Path)
	}
	syncMode := strings.ToUpper(cfg.Synchronous)
	switch syncMode {
	case "":
		syncMode = "FULL"
	case "FULL", "NORMAL", "OFF":
	default:
		return nil, fmt.Errorf("open log: unknown synchronous mode %q (want FULL, NORMAL or OFF)", cfg.Synchronous)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 2048
	}
	if cfg.ReadConns <= 0 {
		cfg.ReadConns = 4
	}
	if cfg.ProjectAfter <= 0 {
		cfg.ProjectAfter = defaultProjectAfter
	}
	if cfg.MaxCachedIntents <= 0 {
		cfg.MaxCachedIntents = 1 << 18
	}

	// One writer per log: a second one (another process, or another Open
	// in this one) would fold this writer's pending projection rows behind
	// its back, and this writer's own insert of them would then fail, and
	// every commit after it. Readers alongside a writer use OpenReadOnly.
	lock, err := dirlock.AcquireFile(cfg.Path + writerLockSuffix)
	var held *dirlock.HeldError
	switch {
	case errors.As(err, &held):
		who := "another handle"
		if held.PID > 0 && held.PID != os.Getpid() {
			who = "process " + strconv.Itoa(held.PID)
		}
		return nil, fmt.Errorf("open log %s: %s has it open for writing (lock %s); read it with OpenReadOnly, or stop that writer first",
			cfg.Path, who, held.Path)
	case errors.Is(err, dirlock.ErrUnsupported):
		lock = nil // no file locks here: nothing guards against a second writer
	case err != nil:
		return nil, fmt.Errorf("open log %s: %w", cfg.Path, err)
	}

	if err := restrictFiles(cfg.Path); err != nil {
		_ = lock.Release()
		return nil, fmt.Errorf("open log %s: %w", cfg.Path, err)
	}
	wq := url.Values{}
	// A lock another process holds fails a write after writerBusyTimeout,
	// so that a request waiting for it is answered (503) in time.
	wq.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", writerBusyTimeout.Milliseconds()))
	wq.Add("_pragma", "journal_mode(WAL)")
	wq.Add("_pragma", "synchronous("+syncMode+")")
	wq.Add("_pragma", fmt.Sprintf("cache_size(-%d)", writerCacheKiB))
	wq.Add("_pragma", "temp_store(MEMORY)")
	wq.Add("_pragma", "wal_autocheckpoint(0)") // see checkpoint.go
	wq.Set("_txlock", "immediate")
	wdb, err := sqlx.Open("sqlite", cfg.Path+"?"+wq.Encode())
	if err != nil {
		_ = lock.Release()
		return nil, fmt.Errorf("open log %s: %w", cfg.Path, err)
	}
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)

	l := &Log{
		cfg:        cfg,
		clock:      cfg.Clock,
		logger:     cfg.Logger,
		wdb:        wdb,
		writerLock: lock,
		writerDone: make(chan struct{}),
		subs:       make(map[*Subscription]struct{}),
		fencedCh:   make(chan struct{}),
	}
	l.qcond = sync.NewCond(&l.qmu)
	fail := func(err error) (*Log, error) {
		if l.reads != nil {
			l.reads.close()
		}
		if l.rdb != nil {
			_ = l.rdb.Close()
		}
		if l.ckpt != nil {
			_ = l.ckpt.db.Close()
		}
		_ = wdb.Close()
		_ = lock.Release()
		return nil, fmt.Errorf("open log %s: %w", cfg.Path, err)
	}
	migrated, err := l.createSchema(ctx)
	if err != nil {
		return fail(err)
	}
	if err := l.loadID(ctx); err != nil {
		return fail(err)
	}
	fresh, err := l.createOwned(ctx)
	if err != nil {
		return fail(err)
	}
	if fresh {
		// An owner's projection is new on a log that has events: fold
		// its rows from the whole log, once.
		l.logger.Info("a projection is new on this log; the projections will be rebuilt")
		migrated = true
	}

	if l.ckpt, err = openCheckpointer(cfg.Path, syncMode); err != nil {
		return fail(err)
	}

	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout(10000)")
	rq.Add("_pragma", "query_only(1)")
	rq.Add("_pragma", fmt.Sprintf("cache_size(-%d)", readerCacheKiB))
	rdb, err := sqlx.Open("sqlite", cfg.Path+"?"+rq.Encode())
	if err != nil {
		return fail(err)
	}
	l.rdb = rdb
	rdb.SetMaxOpenConns(cfg.ReadConns)
	rdb.SetMaxIdleConns(cfg.ReadConns)
	rdb.SetConnMaxLifetime(0)
	rdb.SetConnMaxIdleTime(0)
	if l.reads, err = prepareReads(ctx, rdb.DB); err != nil {
		return fail(err)
	}

	if err := l.w.prepare(ctx, wdb); err != nil {
		return fail(err)
	}
	if !migrated {
		if err := l.catchUp(ctx); err != nil {
			l.w.closeStmts()
			return fail(err)
		}
	}
	if migrated {
		l.w.cache = make(map[string]*entry)
		l.w.counts = make(map[State]int64, len(States))
		st, err := l.rebuildTx(ctx)
		l.w.discard()
		if err != nil {
			l.w.closeStmts()
			return fail(fmt.Errorf("rebuild projections after migration: %w", err))
		}
		l.logger.Info("rebuilt log projections", "events", st.Events, "intents", st.Intents, "messages", st.Messages)
	}
	if err := l.loadState(ctx, migrated); err != nil {
		l.w.closeStmts()
		return fail(err)
	}
	if migrated {
		l.projSeq.Store(l.lastSeq.Load())
	}
	m, err := newMetrics(cfg.Registerer, cfg.Replicator != nil)
	if err != nil {
		l.w.closeStmts()
		return fail(err)
	}
	l.m = m
	if cfg.Replicator != nil {
		l.ship = newShipper(l, cfg.Replicator)
	}
	if migrated {
		l.setGauges(l.w.counts)
	} else {
		for i, s := range States {
			l.m.gauges[i].Set(float64(l.w.counts[s]))
		}
		l.startTerminalCount()
	}
	l.position.Store(l.lastSeq.Load() + l.w.opCount)
	l.startRowKeyScan()
	go l.runCheckpointer()
	go l.run()
	return l, nil
}

// OpenReadOnly opens the existing log at path for reading only, alongside a
// process that may be writing it: no schema change, no writer, no
// checkpoints. Append and Do return errClosed.
func OpenReadOnly(ctx context.Context, path string) (*Log, error) {
	bindOnce.Do(func() { sqlx.BindDriver("sqlite", sqlx.QUESTION) })
	if strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("open log: path %q must not contain '?'", path)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout(10000)")
	rq.Add("_pragma", "query_only(1)")
	rdb, err := sqlx.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	rdb.SetMaxOpenConns(1)
	var version int
	if err := rdb.GetContext(ctx, &version, `PRAGMA user_version`); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	if version != schemaVersion {
		_ = rdb.Close()
		return nil, fmt.Errorf("open log %s: schema version %d, this binary reads %d (start beam serve once to migrate)", path, version, schemaVersion)
	}
	m, err := newMetrics(nil, false)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	l := &Log{
		cfg:        Config{Path: path, MaxBatch: 2048},
		clock:      time.Now,
		logger:     slog.Default(),
		rdb:        rdb,
		m:          m,
		closed:     true, // nothing may be queued: there is no writer
		writerDone: make(chan struct{}),
		subs:       make(map[*Subscription]struct{}),
		fencedCh:   make(chan struct{}),
	}
	close(l.writerDone)
	_ = rdb.GetContext(ctx, &l.id, `SELECT value FROM log_meta WHERE key = 'id'`) // none in a file older than IDs
	if l.reads, err = prepareReads(ctx, rdb.DB); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	l.qcond = sync.NewCond(&l.qmu)
	return l, nil
}

// createSchema creates the tables of a new log or migrates an older one.
// It reports whether the projections must be rebuilt (after a migration).
func (l *Log) createSchema(ctx context.Context) (bool, error) {
	var version int
	if err := l.wdb.GetContext(ctx, &version, `PRAGMA user_version`); err != nil {
		return false, fmt.Errorf("read schema version: %w", err)
	}
	if version > schemaVersion {
		return false, fmt.Errorf("log schema version %d is newer than this binary's (%d)", version, schemaVersion)
	}
	tx, err := l.wdb.BeginTxx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("create schema: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var qs []string
	migrate := version == 1
	if migrate {
		l.logger.Info("migrating the log schema; the projections will be rebuilt", "from", version, "to", schemaVersion)
		qs = append(qs, migrateV1...)
	}
	qs = append(qs, createEvents, createIntentLog, indexIntentLog, createMessages, indexMessages, createMesh, indexMesh,
		createProjSeq, createReplication,
		fmt.Sprintf(`PRAGMA user_version = %d`, schemaVersion))
	for _, q := range qs {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return false, fmt.Errorf("create schema: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("create schema: %w", err)
	}
	return migrate, nil
}

// loadState reads what the writer keeps in memory: the next seq, the
// non-terminal intent rows (and their bus messages) and the state counts.
// It runs on the write connection before the writer starts.
func (l *Log) loadState(ctx context.Context, allStates bool) error {
	var maxSeq sql.NullInt64
	if err := l.wdb.GetContext(ctx, &maxSeq, `SELECT MAX(seq) FROM intent_trace_events`); err != nil {
		return fmt.Errorf("read last seq: %w", err)
	}
	l.w.nextSeq = maxSeq.Int64 + 1
	l.lastSeq.Store(maxSeq.Int64)

	cache, err := loadCache(ctx, l.wdb, l.cfg.MaxCachedIntents)
	if err != nil {
		return err
	}
	l.w.cache = cache
	l.w.maxCache = l.cfg.MaxCachedIntents
	count := countOpenStates
	if allStates {
		count = countStates
	}
	counts, err := count(ctx, l.wdb)
	if err != nil {
		return err
	}
	l.w.counts = counts
	return nil
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func loadCache(ctx context.Context, q queryer, limit int) (map[string]*entry, error) {
	cache := make(map[string]*entry)
	rows, err := q.QueryContext(ctx, `SELECT `+intentCols+` FROM intent_log WHERE status IN `+openList+` LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("load intent cache: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		e := &entry{}
		if err := scanIntent(rows, &e.row); err != nil {
			return nil, fmt.Errorf("load intent cache: %w", err)
		}
		cache[e.row.Nonce] = e
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load intent cache: %w", err)
	}
	rows.Close()
	mrows, err := q.QueryContext(ctx, `SELECT `+messageCols+` FROM beam_messages WHERE status IN `+openList)
	if err != nil {
		return nil, fmt.Errorf("load message cache: %w", err)
	}
	defer mrows.Close()
	for mrows.Next() {
		m := &MessageRow{}
		if err := scanMessage(mrows, m); err != nil {
			return nil, fmt.Errorf("load message cache: %w", err)
		}
		if e := cache[m.Nonce]; e != nil {
			e.msg = m
		}
	}
	if err := mrows.Err(); err != nil {
		return nil, fmt.Errorf("load message cache: %w", err)
	}
	mrows.Close()
	if err := loadMeshCache(ctx, q, cache); err != nil {
		return nil, err
	}
	if err := loadOwnedCache(ctx, q, cache); err != nil {
		return nil, err
	}
	return cache, nil
}

// countStates counts the intents in every state; it reads every row.
func countStates(ctx context.Context, q queryer) (map[State]int64, error) {
	return groupStates(ctx, q, `SELECT status, COUNT(*) FROM intent_log GROUP BY status`)
}

// groupStates runs a "SELECT status, COUNT(*) … GROUP BY status" query.
func groupStates(ctx context.Context, q queryer, query string) (map[State]int64, error) {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("count states: %w", err)
	}
	defer rows.Close()
	counts := make(map[State]int64, len(States))
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("count states: %w", err)
		}
		counts[State(s)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count states: %w", err)
	}
	return counts, nil
}

// Close stops accepting appends (they fail with errClosed), commits
// everything already submitted, stops the writer, ends all subscriptions
// with errClosed and closes the database. It is safe to call more than once;
// later calls return the first call's result.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.stopTerminalCount()
		l.stopRowKeyScan()
		l.qmu.Lock()
		l.closed = true
		l.qcond.Signal()
		l.qmu.Unlock()
		<-l.writerDone
		if l.ship != nil {
			l.ship.close(shipCloseWait)
		}

		l.subMu.Lock()
		l.subsDone = true
		subs := make([]*Subscription, 0, len(l.subs))
		for s := range l.subs {
			subs = append(subs, s)
		}
		l.subMu.Unlock()
		for _, s := range subs {
			s.stop(errClosed)
		}
		l.subWG.Wait()

		var errC, errW error
		if l.ckpt != nil { // nil for OpenReadOnly
			errC = l.ckpt.close()
		}
		l.w.closeStmts()
		l.reads.close()
		if l.wdb != nil {
			errW = l.wdb.Close()
		}
		errR := l.rdb.Close()
		errL := l.writerLock.Release() // after the writer's connection: nil for OpenReadOnly
		if err := errors.Join(errC, errW, errR, errL); err != nil {
			l.closeErr = fmt.Errorf("close log: %w", err)
		}
	})
	return l.closeErr
}

// ReadDB returns the read-only connection pool, for the packages that keep
// tables of their own in the log's file (the registry, the federation
// outbox) to read those tables. The log's own tables are read through its
// query methods (queries.go), never with SQL from outside this package
// (a query that must join a projection table calls Sync first);
// writes must go through Append or Do.
func (l *Log) ReadDB() *sqlx.DB { return l.rdb }

// LastSeq returns the seq of the latest committed event (0 for an empty log).
func (l *Log) LastSeq() int64 { return l.lastSeq.Load() }

// State returns the current state of a nonce from intent_log; false when the
// nonce has no event.
func (l *Log) State(ctx context.Context, nonce string) (State, bool, error) {
	if e := l.pending(nonce); e != nil {
		return e.row.Status, true, nil
	}
	var s string
	err := l.rdb.QueryRowContext(ctx, `SELECT status FROM intent_log WHERE nonce = ?`, nonce).Scan(&s)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read state of %q: %w", nonce, err)
	}
	return State(s), true, nil
}

// Intent returns the intent_log row of a nonce; false when there is none.
func (l *Log) Intent(ctx context.Context, nonce string) (IntentRow, bool, error) {
	if e := l.pending(nonce); e != nil {
		return e.row, true, nil
	}
	var r IntentRow
	err := scanIntent(l.rdb.QueryRowContext(ctx, selectIntent, nonce), &r)
	if errors.Is(err, sql.ErrNoRows) {
		return IntentRow{}, false, nil
	}
	if err != nil {
		return IntentRow{}, false, fmt.Errorf("read intent %q: %w", nonce, err)
	}
	return r, true, nil
}

// Message returns the beam_messages row of a nonce; false when the nonce is
// not a bus message.
func (l *Log) Message(ctx context.Context, nonce string) (MessageRow, bool, error) {
	if e := l.pending(nonce); e != nil {
		if e.msg == nil {
			return MessageRow{}, false, nil
		}
		return *e.msg, true, nil
	}
	var m MessageRow
	err := scanMessage(l.rdb.QueryRowContext(ctx, selectMessage, nonce), &m)
	if errors.Is(err, sql.ErrNoRows) {
		return MessageRow{}, false, nil
	}
	if err != nil {
		return MessageRow{}, false, fmt.Errorf("read message %q: %w", nonce, err)
	}
	return m, true, nil
}

// NonTerminal returns every intent_log row whose status is not acked,
// failed or dead_letter, oldest request first. Startup recovery uses it.
func (l *Log) NonTerminal(ctx context.Context) ([]IntentRow, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	var out []IntentRow
	err := eachRow(ctx, l.rdb.DB, "read non-terminal intents", `SELECT `+intentCols+` FROM intent_log WHERE status IN `+openList+
		` ORDER BY requested_at, nonce`, nil, scanIntent, func(r *IntentRow) error {
		out = append(out, *r)
		return nil
	})
	return out, err
}

// CountByState returns the number of intents in each state (states with no
// intent are absent).
func (l *Log) CountByState(ctx context.Context) (map[State]int64, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	return countStates(ctx, l.rdb)
}

// Trace returns the events of a nonce in seq order (at most maxTraceEvents).
// The events are found through the nonce's intent_log row; a nonce whose
// row is not written yet (behind.go) is looked for among the events after
// the projections' high-water mark, in the same statement (so in the same
// snapshot).
func (l *Log) Trace(ctx context.Context, nonce string) ([]Event, error) {
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+eventCols+` FROM intent_trace_events WHERE `+eventsByNonce+`
		UNION ALL SELECT `+eventCols+` FROM intent_trace_events WHERE seq > (SELECT seq FROM projection_seq) AND nonce = ?
		  AND NOT EXISTS (SELECT 1 FROM intent_log WHERE nonce = ?)
		ORDER BY seq LIMIT ?`, nonce, nonce, nonce, nonce, maxTraceEvents)
	if err != nil {
		return nil, fmt.Errorf("read trace %q: %w", nonce, err)
	}
	defer rows.Close()
	var out []Event
	var sc eventScan
	for rows.Next() {
		ev, err := sc.scan(rows, true)
		if err != nil {
			return nil, fmt.Errorf("read trace %q: %w", nonce, err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read trace %q: %w", nonce, err)
	}
	return out, nil
}

// Events returns up to limit committed events with seq > afterSeq in seq
// order (limit is capped at 10000).
func (l *Log) Events(ctx context.Context, afterSeq int64, limit int) ([]Event, error) {
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	return l.readEvents(ctx, afterSeq, l.LastSeq(), limit)
}

func (l *Log) readEvents(ctx context.Context, afterSeq, uptoSeq int64, limit int) ([]Event, error) {
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+eventCols+` FROM intent_trace_events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?`,
		afterSeq, uptoSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("read events after %d: %w", afterSeq, err)
	}
	defer rows.Close()
	out := make([]Event, 0, min(limit, 512))
	var sc eventScan
	for rows.Next() {
		ev, err := sc.scan(rows, true)
		if err != nil {
			return nil, fmt.Errorf("read events after %d: %w", afterSeq, err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events after %d: %w", afterSeq, err)
	}
	return out, nil
}

// eventScan scans event rows with reusable buffers.
type eventScan struct {
	seq, at, attempt                              int64
	nonce, state, from, to, intentType, transport string
	d                                             sql.RawBytes
}

func (s *eventScan) scan(rows *sql.Rows, full bool) (Event, error) {
	if err := rows.Scan(&s.seq, &s.nonce, &s.state, &s.at, &s.from, &s.to, &s.intentType, &s.transport,
		&s.attempt, &s.d); err != nil {
		return Event{}, err
	}
	ev := Event{
		Seq: s.seq, Nonce: s.nonce, State: State(s.state), At: time.UnixMicro(s.at).UTC(),
		From: s.from, To: s.to, IntentType: s.intentType, Transport: s.transport, Attempt: int(s.attempt),
	}
	var err error
	if full {
		err = ev.Details.UnmarshalJSON(s.d)
	} else {
		err = ev.Details.decodeKnown(s.d)
	}
	if err != nil {
		return Event{}, fmt.Errorf("event %d: %w", s.seq, err)
	}
	return ev, nil
}

// WriteErr returns the error of the writer's last batch when that batch
// failed and no batch has committed events since, nil otherwise. A log in
// this state is refusing writes (a full disk, a file changed under it).
func (l *Log) WriteErr() error {
	if p := l.writeErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Ping runs a query on the read pool and a transaction through the writer,
// and fails when the writer's last batch failed (WriteErr): a log that
// answers reads but refuses writes is not healthy.
func (l *Log) Ping(ctx context.Context) error {
	l.qmu.Lock()
	closed := l.closed
	l.qmu.Unlock()
	if closed {
		return errClosed
	}
	var one int
	if err := l.rdb.GetContext(ctx, &one, `SELECT 1 FROM sqlite_master LIMIT 1`); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("ping log read pool: %w", err)
	}
	_, err := l.Do(ctx, func(tx *sqlx.Tx) error {
		return tx.GetContext(ctx, &one, `SELECT 1`)
	})
	if err != nil {
		return fmt.Errorf("ping log writer: %w", err)
	}
	if err := l.WriteErr(); err != nil {
		return fmt.Errorf("log writer: last commit failed: %w", err)
	}
	return nil
}
