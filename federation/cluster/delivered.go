package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/beamdir/beam/directory"
)

// The delivered bucket (BEAM_DELIVERED_<domain token>) holds, per bus
// message its recipient acknowledged, the record the delivering node wrote
// before it reported the acknowledgement (directory.DeliveryRecord, key:
// the sender and nonce as in the nonces bucket). A node about to deliver
// an attempt of a message again reads it first, so an acknowledgement
// survives the node that received it (docs/ARCHITECTURE.md, "Cluster
// mode", Bus).

// deliveredTTL is how long a delivery record is kept. A record is needed
// from the acknowledgement until the owner's next attempt of the message
// (its retry delay, or its restart): an owner down for longer, or a retry
// schedule with longer delays, delivers the message again. It bounds the
// bucket to the acknowledgements of the last hour.
const deliveredTTL = time.Hour

// deliveredRetry is the pause between tries while the bucket is
// unavailable (its stream electing a leader after a node died);
// deliveredTry bounds one try of a write, so a write made while the
// stream has no leader is made again soon after it has one.
const (
	deliveredRetry = 250 * time.Millisecond
	deliveredTry   = time.Second
)

// RecordDelivery stores rec in the delivered bucket, retrying while the
// bucket is unavailable until ctx ends (directory.NodeRouter).
func (n *Node) RecordDelivery(ctx context.Context, rec directory.DeliveryRecord) error {
	rec.Node = n.cfg.NodeID
	tok, err := n.seal(typDelivery, rec)
	if err != nil {
		return fmt.Errorf("encode delivery record: %w", err)
	}
	b := []byte(tok)
	key := nonceKey(rec.From, rec.Nonce)
	for {
		tctx, cancel := context.WithTimeout(ctx, deliveredTry)
		_, err = n.route.delivered.Put(tctx, key, b)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("record delivery of %s: %w", rec.Nonce, err)
		}
		sleep(ctx, deliveredRetry)
	}
}

// Delivery returns the delivery record of from's nonce; ok is false when
// there is none. While the bucket is unavailable it tries again until ctx
// ends and then returns the error (directory.NodeRouter).
func (n *Node) Delivery(ctx context.Context, from, nonce string) (directory.DeliveryRecord, bool, error) {
	key := nonceKey(from, nonce)
	for {
		e, err := n.route.delivered.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return directory.DeliveryRecord{}, false, nil
		case err == nil:
			// A record no member sealed is no acknowledgement: the message
			// is delivered again rather than settled by a forgery.
			var rec directory.DeliveryRecord
			if err := n.openAs(typDelivery, e.Value(), &rec, func() string { return rec.Node }); err != nil {
				n.refuse("delivery", err, "nonce", nonce)
				return directory.DeliveryRecord{}, false, nil
			}
			return rec, true, nil
		}
		if ctx.Err() != nil {
			return directory.DeliveryRecord{}, false, fmt.Errorf("read delivery record of %s: %w", nonce, err)
		}
		sleep(ctx, deliveredRetry)
	}
}
