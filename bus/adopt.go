package bus

import (
	"context"
	"math"

	"github.com/beamdir/beam/tracing"
)

// Adopt takes over nonces, messages a takeover imported into this log from
// a dead node's log, while the bus runs: each one that is still unfinished
// and that nothing of this node has touched since the import
// (tracing.Log.Adoptable) is recovered as Recover recovers a message at
// startup (received and dispatched ones requeued at once with the same
// nonce, delivered ones given their delivery timeout to receive a result,
// queued ones left to their schedule), and gets one event of transport
// tracing.TransportTakeover in its trace. In cluster mode a later attempt
// reads the cluster's delivery record first (checkRecord), so a message
// the dead node delivered and saw acknowledged is settled from the record,
// not delivered again. A message adopted once, or one this bus drives, is
// skipped: calling Adopt again adopts nothing.
func (b *Bus) Adopt(ctx context.Context, nonces []string) (RecoveryReport, error) {
	var rep RecoveryReport
	var err error
	rep.Adopted, err = tracing.AdoptEach(nonces, func(nonce string) (bool, error) { return b.adoptOne(ctx, nonce, &rep) })
	if rep.Adopted > 0 {
		b.lg.Info("bus adopted messages", "adopted", rep.Adopted, "requeued", rep.Requeued, "awaitingResult", rep.AwaitingResult)
	}
	return rep, err
}

// adoptOne adopts one message, reports whether it did and counts what it
// did in rep.
func (b *Bus) adoptOne(ctx context.Context, nonce string, rep *RecoveryReport) (bool, error) {
	unlock := b.keys.Lock(nonce)
	defer unlock()
	from, ok, err := b.log.Adoptable(ctx, nonce)
	if err != nil || !ok {
		return false, err
	}
	c, ok, err := b.current(ctx, nonce)
	if err != nil || !ok || c.Status.Terminal() || b.inFlight(nonce) {
		return false, err
	}
	how := recovery{transport: tracing.TransportTakeover, why: "Taken over from a node that stopped",
		action: "requeued_after_takeover", from: &from}
	row := c.MessageRow
	switch row.Status {
	case tracing.Received, tracing.Validated, tracing.Dispatched:
		requeued, err := b.requeueInterrupted(c, how)
		if err != nil || !requeued {
			return false, err
		}
		rep.Requeued++
	case tracing.Queued:
		// Tick and the recipient's drain pick it up on its schedule.
		ev := event(row, tracing.Queued, how.transport, c.Attempt)
		if row.NextRetryAt != nil {
			ev.Details.NextRetryAt = int64(math.Round(*row.NextRetryAt * 1000))
		}
		ev.Details.Extra = from.Marker(nil)
		if err := b.append(ev); err != nil {
			return false, err
		}
	case tracing.Delivered:
		at := row.UpdatedAt
		if row.DeliveredAt != nil {
			at = *row.DeliveredAt
		}
		last, err := b.lastDetails(ctx, nonce)
		if err != nil {
			return false, err
		}
		awaiting, err := b.awaitResult(ctx, nonce, at, how)
		if err != nil {
			return false, err
		}
		extra := from.Marker(nil)
		if last.Extra["asyncAccepted"] == true {
			// A later restart's Recover reads it from the latest event.
			extra["asyncAccepted"] = true
		}
		ev := event(row, tracing.Delivered, how.transport, c.Attempt)
		ev.Details.Extra = extra
		if err := b.append(ev); err != nil {
			b.forget(nonce)
			return false, err
		}
		if awaiting {
			rep.AwaitingResult++
		}
	default:
		return false, nil
	}
	b.kickDrain(row.Recipient, false)
	return true, nil
}

// inFlight reports whether the bus has a WebSocket attempt of nonce in
// flight or waits for its result.
func (b *Bus) inFlight(nonce string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, flying := b.flights[nonce]
	_, waiting := b.recovered.When(nonce)
	return flying || waiting
}
