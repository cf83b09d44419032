package tracing

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// The intents-by-state gauges at start. The open states (few rows, found
// through the status index) are counted before the writer starts. The
// terminal states hold nearly every row of a long-lived log, so counting
// them would make every start grow with the log; they are counted after
// the log is serving, on a read snapshot, while the writer keeps going:
//
//   - until then, the writer adds each commit's changes to the terminal
//     gauges as usual and also remembers them with the commit's last seq;
//   - the counter reads the projections' high-water mark and the terminal
//     counts in one read transaction, so both describe the same snapshot;
//   - it then adds to each terminal gauge its count minus what the
//     remembered commits up to that seq already added (those commits are in
//     the snapshot too), and the writer stops remembering.
//
// A Rebuild before the count is done sets every gauge exactly and the
// late count is dropped.

// commitDelta is what one commit changed in the terminal states' counts.
type commitDelta struct {
	lastSeq int64
	d       [8]int64
}

// terminalCounts is the state of the deferred count, guarded by
// Log.countMu.
type terminalCounts struct {
	known   bool
	pending []commitDelta
	done    chan struct{} // closed when the counter goroutine has exited
	cancel  context.CancelFunc
}

// countOpenStates counts the intents in the open states.
func countOpenStates(ctx context.Context, q queryer) (map[State]int64, error) {
	return groupStates(ctx, q, `SELECT status, COUNT(*) FROM intent_log WHERE status IN `+openList+` GROUP BY status`)
}

// startTerminalCount starts the counter goroutine.
func (l *Log) startTerminalCount() {
	ctx, cancel := context.WithCancel(context.Background())
	l.tc.cancel = cancel
	l.tc.done = make(chan struct{})
	go func() {
		defer close(l.tc.done)
		t0 := time.Now()
		snap, counts, err := l.countTerminal(ctx)
		if err != nil {
			if ctx.Err() == nil {
				l.logger.Error("count finished intents for the state gauges", "err", err)
			}
			return
		}
		l.installTerminalCounts(snap, counts)
		l.logger.Debug("counted finished intents", "took", time.Since(t0), "counts", counts)
	}()
}

// stopTerminalCount stops the counter goroutine and waits for it.
func (l *Log) stopTerminalCount() {
	if l.tc.cancel != nil {
		l.tc.cancel()
		<-l.tc.done
	}
}

// countTerminal reads, in one read transaction, the last committed seq and
// the number of intents in each terminal state at that seq.
func (l *Log) countTerminal(ctx context.Context) (int64, map[State]int64, error) {
	tx, err := l.rdb.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return 0, nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// The projections hold every event up to their high-water mark and
	// none after it (behind.go), so the mark is the snapshot's seq.
	var snap sql.NullInt64
	if err := tx.GetContext(ctx, &snap, selectProjSeq); err != nil {
		return 0, nil, fmt.Errorf("read projection seq: %w", err)
	}
	counts, err := groupStates(ctx, tx, `SELECT status, COUNT(*) FROM intent_log WHERE status IN `+terminalList+` GROUP BY status`)
	if err != nil {
		return 0, nil, err
	}
	return snap.Int64, counts, nil
}

// installTerminalCounts corrects the terminal gauges with counts read at
// seq snap.
func (l *Log) installTerminalCounts(snap int64, counts map[State]int64) {
	l.countMu.Lock()
	defer l.countMu.Unlock()
	if l.tc.known {
		return
	}
	var seen [8]int64
	for _, c := range l.tc.pending {
		if c.lastSeq <= snap {
			for i, d := range c.d {
				seen[i] += d
			}
		}
	}
	for i, s := range States {
		if s.Terminal() {
			l.m.gauges[i].Add(float64(counts[s] - seen[i]))
		}
	}
	l.tc.known, l.tc.pending = true, nil
}

// addGaugeDeltas adds a commit's count changes to the gauges (the writer
// calls it after each commit whose last seq is lastSeq) and empties
// deltas.
func (l *Log) addGaugeDeltas(deltas *[8]int64, lastSeq int64) {
	l.countMu.Lock()
	defer l.countMu.Unlock()
	var term commitDelta
	remember := false
	for i, d := range deltas {
		if d == 0 {
			continue
		}
		l.m.gauges[i].Add(float64(d))
		if !l.tc.known && States[i].Terminal() {
			term.d[i], remember = d, true
		}
		deltas[i] = 0
	}
	if remember {
		term.lastSeq = lastSeq
		l.tc.pending = append(l.tc.pending, term)
	}
}

// setGauges sets every state gauge from exact counts (Open after a
// migration, Rebuild): no deferred count is needed any more.
func (l *Log) setGauges(counts map[State]int64) {
	l.countMu.Lock()
	defer l.countMu.Unlock()
	for i, s := range States {
		l.m.gauges[i].Set(float64(counts[s]))
	}
	l.tc.known, l.tc.pending = true, nil
}
