package bus

import (
	"context"
	"errors"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// In cluster mode a message's recipient may have acknowledged an attempt
// whose outcome never reached this node's log: the node holding its
// session died before answering, or this node died before recording the
// answer. The delivering node recorded the acknowledgement in the
// cluster's delivery record first (directory.DeliveryRecord), so before
// the bus delivers a message again it reads that record and settles an
// acknowledged message from it.

// recordCheckTimeout bounds the read of the delivery record before an
// attempt; past it the attempt waits (recordUnavailableDelay) rather than
// deliver unchecked.
const (
	recordCheckTimeout     = 3 * time.Second
	recordUnavailableDelay = time.Second
)

// settledFromRecord is the details.extra.settledFrom of an attempt settled
// from the cluster's delivery record.
const settledFromRecord = "clusterDeliveryRecord"

// checkRecord looks up the cluster's delivery record of row, a message
// about to be attempted after n earlier attempts, and reports whether it
// handled the message: settled it as acked from the record, or, when the
// record cannot be read, put the attempt off without counting it (until
// the records settle, when this node joined its cluster just now:
// directory.RecordsSettling). A first attempt (n == 0) cannot have been
// acknowledged and is not looked up. The caller holds the nonce's lock.
func (b *Bus) checkRecord(ctx context.Context, row tracing.MessageRow, n int) (bool, error) {
	if n == 0 {
		return false, nil
	}
	cctx, cancel := context.WithTimeout(ctx, recordCheckTimeout)
	rec, ok, err := b.dir.ClusterDelivery(cctx, row.Sender, row.Nonce, row.ID)
	cancel()
	switch {
	case err != nil:
		b.lg.Warn("bus attempt put off: the cluster's delivery record cannot be read", "nonce", row.Nonce, "err", err)
		delay := recordUnavailableDelay
		if settling, ok := errors.AsType[*directory.RecordsSettling](err); ok {
			delay = max(delay, settling.Wait)
		}
		ev := event(row, tracing.Queued, transportBus, n)
		ev.Details = tracing.Details{Error: "the cluster's delivery record cannot be read: " + err.Error(),
			NextRetryAt: b.clock().Add(delay).UnixMilli(),
			Extra:       map[string]any{"interrupted": "delivery record unavailable"}}
		return true, b.append(ev)
	case ok:
		return true, b.settleRecorded(row, n, rec)
	}
	return false, nil
}

// settleRecorded records row as acked from the cluster's delivery record
// rec, with attempt n (no new attempt is made): dispatched and delivered
// first when the log does not have them for it. The caller holds the
// nonce's lock.
func (b *Bus) settleRecorded(row tracing.MessageRow, n int, rec directory.DeliveryRecord) error {
	extra := map[string]any{"settledFrom": settledFromRecord, "recordedBy": rec.Node}
	if rec.Attempt > 0 {
		extra["acknowledgedAttempt"] = rec.Attempt
	}
	var evs []tracing.Event
	if row.Status != tracing.Dispatched && row.Status != tracing.Delivered {
		ev := event(row, tracing.Dispatched, directory.TransportCluster, n)
		ev.Details.Extra = extra
		evs = append(evs, ev)
	}
	if row.Status != tracing.Delivered {
		evs = append(evs, event(row, tracing.Delivered, directory.TransportCluster, n))
	}
	ack := event(row, tracing.Acked, directory.TransportCluster, n)
	ack.Details = tracing.Details{Result: rec.Result, LatencyMs: latencyMs(row, b.clock()), Extra: extra}
	if len(rec.Result) > 0 {
		if rf, err := wire.DecodeResultFrame(rec.Result); err == nil {
			ack.Details.Response = objectOrNil(rf.Payload)
		}
	}
	if err := b.append(append(evs, ack)...); err != nil {
		return err
	}
	b.forget(row.Nonce)
	b.m.outcomes.WithLabelValues(string(tracing.Acked)).Inc()
	b.lg.Info("message settled from the cluster's delivery record", "nonce", row.Nonce, "id", row.ID, "recordedBy", rec.Node)
	b.notifySender(row, tracing.Acked, rec.Result)
	return nil
}
