package directory

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// The cluster's delivery record makes a durable message's acknowledgement
// survive the node that received it. The node delivering a bus attempt —
// the message's owner when it holds the recipient's session, else the node
// it was handed to — records the recipient's successful result (message,
// attempt, result) in the cluster (NodeRouter.RecordDelivery) before it
// reports the outcome anywhere: to its own log, to the bus, to the owner.
// Before a bus attempt is delivered again (a retry on the owner, the
// owner's restart recovery, a hand-over to a holder), the record is read:
// a message its recipient acknowledged is settled from it instead.

// DeliveryRecord is the cluster's record that the recipient of a bus
// message acknowledged it.
type DeliveryRecord struct {
	// From and Nonce name the message (its sender and nonce).
	From  string `json:"from"`
	Nonce string `json:"nonce"`
	// MessageID is the bus message's ID.
	MessageID string `json:"messageId"`
	// Attempt is the delivery attempt the recipient acknowledged.
	Attempt int `json:"attempt"`
	// Node is the node that delivered the attempt and recorded it.
	Node string `json:"node,omitempty"`
	// Result is the recipient's result frame; empty when it was too large
	// to keep in the record.
	Result json.RawMessage `json:"result,omitempty"`
	// At is when the acknowledgement was recorded.
	At time.Time `json:"at"`
}

// maxRecordedResult bounds the result frame a delivery record keeps.
const maxRecordedResult = 4 << 10

// HandReply is a node's answer to a hand-over: the result frame, or the
// relay error it answered with.
type HandReply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *RelayError     `json:"error,omitempty"`
	// Recorded: a handed-over bus attempt was not delivered, because the
	// cluster's delivery record says its recipient acknowledged the message
	// already; Result is the result recorded then (may be empty).
	Recorded bool `json:"recorded,omitempty"`
}

// recordTimeout bounds the wait for the cluster to store a delivery record
// before the outcome is reported (a stream may be electing a leader after
// a node died); recordKeep bounds the tries in the background after it.
const (
	recordTimeout = 10 * time.Second
	recordKeep    = time.Hour
)

// recordReadTimeout bounds the read of a delivery record before a
// handed-over attempt is delivered.
const recordReadTimeout = 3 * time.Second

// recordSettle is how long after this node joined its cluster a missing
// delivery record is not taken as "not acknowledged": a node that could not
// store a record while the cluster was without this node (its stream had
// no leader) stores it within a second or two of the stream having one
// again, which is at the latest when this node joins.
const recordSettle = 5 * time.Second

// RecordsSettling is ClusterDelivery's error while delivery records stored
// late may still arrive: this node joined its cluster Joined ago, and
// missing records mean "not acknowledged" after Wait more.
type RecordsSettling struct {
	Joined, Wait time.Duration
}

// Error says how long ago this node joined.
func (e *RecordsSettling) Error() string {
	return fmt.Sprintf("this node joined the cluster %s ago: delivery records stored late may still arrive",
		e.Joined.Round(time.Millisecond))
}

// ClusterDelivery returns the cluster's delivery record of the bus message
// messageID (from's nonce): ok is false when its recipient has not
// acknowledged it, or without cluster mode. An error means the record
// could not be read, or that records may still be arriving (recordSettle):
// the caller must not deliver the message now.
func (d *Directory) ClusterDelivery(ctx context.Context, from, nonce, messageID string) (DeliveryRecord, bool, error) {
	r := d.nodeRouter()
	if r == nil {
		return DeliveryRecord{}, false, nil
	}
	since, _ := r.Joined()
	if joined := d.clock().Sub(since); joined < recordSettle {
		return DeliveryRecord{}, false, &RecordsSettling{Joined: joined, Wait: recordSettle - joined}
	}
	rec, ok, err := r.Delivery(ctx, from, nonce)
	if err != nil || !ok || rec.MessageID != messageID {
		// Another message of the same sender and nonce (long ago) is not
		// this one.
		return DeliveryRecord{}, false, err
	}
	return rec, true, nil
}

// recordBusAck records in the cluster that the recipient acknowledged the
// bus attempt inf (delivered by this node) with rf, before the outcome is
// reported anywhere. Nothing is recorded for another intent, a result that
// is not an acknowledgement (a failure, an async acceptance) or without
// cluster mode. If the cluster cannot store it in time the outcome is
// reported anyway — the owner's log still records the acknowledgement —
// and the record is stored in the background once the cluster can take it
// (until recordKeep or Close): an owner that died before it learned the
// outcome reads it before its next attempt, and a read fails while the
// record's bucket is unavailable, so only this node dying too may deliver
// the message again.
func (d *Directory) recordBusAck(inf *inflight, rf *wire.ResultFrame) {
	r := d.nodeRouter()
	if r == nil || !rf.Success || wire.IsAsyncAcceptance(rf) {
		return
	}
	rec := DeliveryRecord{From: inf.from, Nonce: inf.nonce, Attempt: inf.attempt, At: d.clock().UTC()}
	switch {
	case inf.owned != nil:
		rec.MessageID, rec.Attempt = inf.owned.del.MessageID, inf.owned.del.Attempt
	case inf.busMark != nil:
		rec.MessageID, rec.Attempt = inf.busMark.MessageID, inf.busMark.Attempt
	default:
		return
	}
	if rec.MessageID == "" {
		// Not a bus message (a pipeline hop: every hop of an envelope has
		// the envelope's nonce, so a record would answer a later hop).
		return
	}
	if len(rf.Raw) <= maxRecordedResult {
		rec.Result = rf.Raw
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	err := r.RecordDelivery(ctx, rec)
	if err == nil {
		return
	}
	d.lg.Warn("the cluster did not store a bus acknowledgement yet; reporting it now and storing it in the background",
		"nonce", inf.nonce, "messageId", rec.MessageID, "err", err)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), recordKeep)
		defer cancel()
		go func() {
			select {
			case <-d.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := r.RecordDelivery(ctx, rec); err != nil {
			d.lg.Warn("the cluster never stored a bus acknowledgement", "nonce", rec.Nonce, "messageId", rec.MessageID, "err", err)
			return
		}
		d.lg.Info("the cluster stored a bus acknowledgement late", "nonce", rec.Nonce, "messageId", rec.MessageID)
	}()
}

// recordedHandOver answers a handed-over bus attempt from the cluster's
// delivery record when its recipient acknowledged the message already; ok
// is false when the attempt is to be delivered.
func (d *Directory) recordedHandOver(ctx context.Context, f *wire.IntentFrame, mark *BusMark) (HandReply, bool) {
	ctx, cancel := context.WithTimeout(ctx, recordReadTimeout)
	defer cancel()
	rec, ok, err := d.ClusterDelivery(ctx, f.From, f.Nonce, mark.MessageID)
	switch {
	case err != nil:
		return HandReply{Error: relayErr(CodeDeliveryFailed, f.Nonce,
			"the cluster's delivery record cannot be read now; retry: %v", err)}, true
	case ok:
		d.lg.Info("handed-over bus attempt settled from the cluster's delivery record", "nonce", f.Nonce,
			"messageId", mark.MessageID, "recordedBy", rec.Node)
		return HandReply{Result: rec.Result, Recorded: true}, true
	}
	return HandReply{}, false
}
