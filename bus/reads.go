package bus

import (
	"context"

	"github.com/beamdir/beam/tracing"
)

// The bus reads its messages through the log's query methods
// (tracing.Log.MessageState, WaitingMessages, …): the message projection is
// the log's.

// current is a message's row with the attempt and transport of its latest
// event.
type current = tracing.MessageState

// current reads nonce's message row with its latest attempt; false when the
// nonce is not a bus message.
func (b *Bus) current(ctx context.Context, nonce string) (current, bool, error) {
	return b.log.MessageState(ctx, nonce)
}

// message reads the message row of nonce.
func (b *Bus) message(ctx context.Context, nonce string) (tracing.MessageRow, bool, error) {
	c, ok, err := b.current(ctx, nonce)
	return c.MessageRow, ok, err
}

// nonceExists reports whether the log has any event of nonce.
func (b *Bus) nonceExists(ctx context.Context, nonce string) (bool, error) {
	return b.log.HasNonce(ctx, nonce)
}

// nonceOfID returns the nonce of message id.
func (b *Bus) nonceOfID(ctx context.Context, id string) (string, bool, error) {
	return b.log.MessageNonce(ctx, id)
}

// firstDetails returns the details of the nonce's received event.
func (b *Bus) firstDetails(ctx context.Context, nonce string) (tracing.Details, error) {
	return b.log.FirstDetails(ctx, nonce)
}

// lastDetails returns the details of the nonce's latest event.
func (b *Bus) lastDetails(ctx context.Context, nonce string) (tracing.Details, error) {
	return b.log.LastDetails(ctx, nonce)
}

// waitingFor returns up to limit nonces of recipient's queued messages that
// are due or wait for it, highest priority and oldest first. Messages older
// than the recipient's registration were queued for a deleted agent of the
// same name and are never handed to a later registrant.
func (b *Bus) waitingFor(ctx context.Context, recipient string, nowSecs float64, limit int) ([]string, error) {
	return b.log.WaitingMessages(ctx, recipient, nowSecs, b.registeredSince(recipient), limit)
}

// registeredSince is when beamID's current registration began, in the
// epoch seconds of tracing.MessageRow.CreatedAt (0 when it is not registered
// here). An agent sees and receives only messages created since: a Beam ID
// that was deleted and released to a newcomer hands over none of the old
// agent's messages.
func (b *Bus) registeredSince(beamID string) float64 {
	a, ok := b.reg.Get(beamID)
	if !ok {
		return 0
	}
	// Whole milliseconds below the registration instant, so that a message
	// created in the same millisecond is not lost to rounding.
	return float64(a.CreatedAt.UnixMilli()-1) / 1e3
}
