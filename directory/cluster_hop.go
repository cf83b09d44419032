package directory

import (
	"context"
	"errors"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// A pipeline hop for an actor whose session another node of the cluster
// holds is handed to that node like an intent (the same sealed hand-over,
// HandOver.Hop set), but the holder does not relay it: it hands the frame
// to the session through its own door for the owner (Deliver, with the
// hop's author and the owner's attestation), records nothing, and answers
// the attempt's outcome, which settles the hop on the owner as a local
// answer would. The owner traces the whole hop.

// hopOwner is the owner of a handed-over hop on the holder: the owning
// node records the hop's delivered event with its outcome
// (Outcome.Written), so nothing is appended here.
type hopOwner struct{}

// Delivered records nothing: the owning node records delivered.
func (hopOwner) Delivered([]Written) error { return nil }

// deliverHandedHop delivers a hop another node handed over to the session
// this node holds and returns the attempt's outcome.
func (d *Directory) deliverHandedHop(ctx context.Context, f *wire.IntentFrame, h HandOver) HandReply {
	m := h.Hop
	switch {
	case f.Intent != pipelineHopIntent || f.Signature != "":
		return HandReply{Error: relayErr(CodeInvalidIntent, f.Nonce, "a handed-over hop is an unsigned %s frame", pipelineHopIntent)}
	case m.Author == "" || (m.Auth != BusAuthAPIKey && m.Auth != BusAuthBusKey):
		return HandReply{Error: relayErr(CodeInvalidIntent, f.Nonce, "a handed-over hop names its author and how its sender was authenticated")}
	}
	ch := make(chan Outcome, 1)
	d.Deliver(ctx, Delivery{Frame: f, SenderKey: m.SenderKey, Auth: m.Auth, Author: m.Author,
		MessageID: m.MessageID, Attempt: m.Attempt, Timeout: time.Duration(h.TimeoutMs) * time.Millisecond,
		Owner: hopOwner{}, Done: func(o Outcome) { ch <- o }, handed: true})
	select {
	case o := <-ch:
		return hopReply(f.Nonce, o)
	case <-ctx.Done():
		return HandReply{Error: relayErr(CodeTimeout, f.Nonce, "the hop's outcome did not come in time: %v", ctx.Err())}
	}
}

// hopReply is the answer to a handed-over hop that ended with o.
func hopReply(nonce string, o Outcome) HandReply {
	switch {
	case errors.Is(o.Err, ErrRecipientOffline):
		return HandReply{Error: relayErr(CodeOffline, nonce, "%v", o.Err)}
	case errors.Is(o.Err, ErrNonceBusy):
		return HandReply{Error: relayErr(CodeInProgress, nonce, "%v", o.Err)}
	case o.Err != nil:
		return HandReply{Error: relayErr(CodeInvalidIntent, nonce, "%v", o.Err)}
	case o.Result != nil && len(o.Result.Raw) > 0:
		return HandReply{Result: o.Result.Raw}
	case o.Result != nil:
		return HandReply{Error: relayErr(CodeDeliveryFailed, nonce, "the actor's result cannot be passed on")}
	}
	return HandReply{Error: relayErr(o.ErrorCode, nonce, "%s", o.Error)}
}
