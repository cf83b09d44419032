package directory

import (
	"context"

	"github.com/beamdir/beam/tracing"
)

// Adopt takes over nonces that a takeover imported into this log from a
// dead node's log while the directory runs. The intents the dead node was
// relaying cannot be answered any more (their senders' connections died
// with it), so each one this directory owns whose latest event is the
// imported one (tracing.Log.Adoptable) is settled as Recover settles it at
// startup (recoverIntent), with transport takeover: received, validated,
// queued and dispatched ones fail retryably, a delivered one waits for a
// late result until its deadline. As at startup, a nonce of any owner
// still in received is remembered as one the bus may hold there. An intent
// adopted once, or one this directory relays, is skipped: calling Adopt
// again adopts nothing. It returns how many intents it adopted.
func (d *Directory) Adopt(ctx context.Context, nonces []string) (int, error) {
	var rep recoveryReport
	n, err := tracing.AdoptEach(nonces, func(nonce string) (bool, error) { return d.adoptOne(ctx, nonce, &rep) })
	if n > 0 {
		d.lg.Info("adopted intents", "failedInterrupted", rep.FailedInterrupted,
			"resumedAwaitingResult", rep.ResumedAwaitingResult, "timedOutAwaitingResult", rep.TimedOutAwaitingResult)
	}
	return n, err
}

// adoptOne adopts one intent and counts it in rep.
func (d *Directory) adoptOne(ctx context.Context, nonce string, rep *recoveryReport) (bool, error) {
	row, ok, err := d.log.Intent(ctx, nonce)
	if err != nil || !ok || row.Status.Terminal() {
		return false, err
	}
	if row.Status == tracing.Received {
		d.mu.Lock()
		d.noteBusReceived(nonce)
		d.mu.Unlock()
	}
	if row.Owner != "" && row.Owner != tracing.OwnerDirectory {
		return false, nil
	}
	// Claimed as a relay would claim it, so no relay of the nonce runs
	// meanwhile; one running already means this node has it.
	inf := &inflight{nonce: nonce, done: func([]byte, *RelayError) {}, released: make(chan struct{})}
	d.mu.Lock()
	_, relaying := d.claims[nonce]
	if !relaying {
		d.claims[nonce] = inf
	}
	d.mu.Unlock()
	if relaying {
		return false, nil
	}
	defer d.release(inf)
	from, ok, err := d.log.Adoptable(ctx, nonce)
	if err != nil || !ok {
		return false, err
	}
	if row, ok, err = d.log.Intent(ctx, nonce); err != nil || !ok || row.Status.Terminal() {
		return false, err
	}
	ev, deadline, err := d.recoverIntent(ctx, row, d.clock(), rep, &from)
	if err != nil || ev == nil {
		return false, err
	}
	if err := d.append(*ev); err != nil {
		return false, err
	}
	if !deadline.IsZero() {
		d.mu.Lock()
		d.recovered[nonce] = deadline
		d.mu.Unlock()
	}
	return true, nil
}
