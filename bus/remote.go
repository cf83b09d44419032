package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// codeSignedFrameRequired: a forwarded message had no frame to carry. A
// sender-signed frame travels verbatim; every other send (API key, bus
// key, beam/2 JWS) travels as an unsigned frame the origin directory
// vouches for in its signed federation message.
const codeSignedFrameRequired = "SIGNED_FRAME_REQUIRED"

// Remote is the federation router through which the bus sends to agents of
// peer directories (federation.Node implements it). The bus needs it only
// as this interface, so it does not import federation.
type Remote interface {
	// PeerFor returns the pinned peer directory serving the Beam ID to.
	PeerFor(to string) (peer string, ok bool)
	// Forward records events (ending with the dispatched event) and the
	// outbox row carrying the frame to the peer in one log transaction.
	Forward(ctx context.Context, req directory.ForwardRequest, events ...tracing.Event) error
}

// remoteRouter returns the federation router; nil without federation.
func (b *Bus) remoteRouter() Remote { return b.cfg.Remote }

// remotePeer returns the peer directory serving a recipient that is not a
// local agent, or "" when none does.
func (b *Bus) remotePeer(to string) string {
	r := b.remoteRouter()
	if r == nil {
		return ""
	}
	if peer, ok := r.PeerFor(to); ok {
		return peer
	}
	return ""
}

// forward starts attempt prev+1 of row through the federation outbox: the
// dispatched event (transport federation, details.peer) and the outbox row
// are committed together, and the relay publishes the sender's signed frame
// verbatim (or, for a sender this directory authenticated otherwise, an
// unsigned frame it vouches for) until the peer answers. The caller holds
// the nonce's lock.
func (b *Bus) forward(r Remote, peer string, row tracing.MessageRow, first tracing.Details, prev int) error {
	admitted := time.UnixMicro(int64(row.CreatedAt * 1e6))
	frame, auth, err := remoteFrame(row, first, admitted)
	if err != nil {
		return b.retry(row, prev, transportBus, codeSignedFrameRequired,
			"recipient "+row.Recipient+" is served by the peer directory "+peer+": "+err.Error(),
			nil, map[string]any{"peer": peer}, nil, false)
	}
	n := prev + 1
	disp := event(row, tracing.Dispatched, directory.TransportFederation, n)
	disp.Details.TimeoutMs = b.cfg.DeliveryTimeout.Milliseconds()
	disp.Details.Extra = map[string]any{"peer": peer, "hop": 1}
	if auth != directory.BusAuthSignature {
		// The peer attests the frame; this directory vouches for the sender.
		disp.Details.Extra["vouchedAuth"] = auth
	}
	req := directory.ForwardRequest{
		Nonce: row.Nonce, From: row.Sender, To: row.Recipient, IntentType: row.Intent,
		Frame: frame, Peer: peer, Owner: tracing.OwnerBus, Attempt: n, Timeout: b.cfg.DeliveryTimeout,
		Admitted: admitted,
	}
	if auth != directory.BusAuthSignature {
		req.VouchedAuth = auth
	}
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	if err := r.Forward(ctx, req, disp); err != nil {
		return fmt.Errorf("forward %s to %s: %w", row.Nonce, peer, err)
	}
	b.m.attempts.WithLabelValues(directory.TransportFederation).Inc()
	b.signal(row.Nonce, tracing.Dispatched)
	b.lg.Debug("message forwarded to a peer directory", "nonce", row.Nonce, "peer", peer, "attempt", n)
	return nil
}

// RemoteOutcome runs after federation committed the peer's outcome of a
// forwarded message (federation.Config.BusOutcome): it updates the
// metrics, wakes a waiting send and tells a connected sender how the
// message ended.
func (b *Bus) RemoteOutcome(nonce string) {
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	row, ok, err := b.message(ctx, nonce)
	defer func() { b.signal(nonce, row.Status) }()
	if err != nil || !ok {
		if err != nil {
			b.lg.Warn("remote outcome: read message", "nonce", nonce, "err", err)
		}
		return
	}
	ir, _, err := b.log.Intent(ctx, nonce)
	if err != nil {
		b.lg.Warn("remote outcome: read intent", "nonce", nonce, "err", err)
		return
	}
	switch row.Status {
	case tracing.Delivered:
		b.observeDelivery(row)
		b.m.outcomes.WithLabelValues("accepted").Inc()
	case tracing.Acked:
		b.observeDelivery(row)
		b.forget(nonce)
		b.m.outcomes.WithLabelValues(string(tracing.Acked)).Inc()
		b.notifySender(row, tracing.Acked, ir.ResultJSON)
	case tracing.Failed:
		b.forget(nonce)
		b.m.outcomes.WithLabelValues(string(tracing.Failed)).Inc()
		b.notifySender(row, tracing.Failed, ir.ResultJSON)
	case tracing.DeadLetter:
		b.forget(nonce)
		b.m.deadLetters.Inc()
		b.m.outcomes.WithLabelValues(string(tracing.DeadLetter)).Inc()
		b.notifySender(row, tracing.DeadLetter, ir.ResultJSON)
	}
}

// viaFederation reports whether nonce's latest event handed it to the
// federation outbox, which then owns the attempt.
func (b *Bus) viaFederation(ctx context.Context, nonce string) bool {
	ir, ok, err := b.log.Intent(ctx, nonce)
	return err == nil && ok && ir.Transport == directory.TransportFederation
}

// remoteFrame is the frame a forwarded message carries and how its sender
// was authenticated: the sender-signed frame verbatim, or an unsigned frame
// built from the message (its nonce, timestamped at admission, so every
// attempt carries the same frame) that the origin directory vouches for in
// its signed federation message; the peer delivers it attested.
func remoteFrame(row tracing.MessageRow, first tracing.Details, admitted time.Time) ([]byte, string, error) {
	auth, _ := first.Extra["auth"].(string)
	if auth == directory.BusAuthSignature {
		if len(first.Frame) == 0 {
			return nil, "", errors.New("the signed frame was not recorded")
		}
		return first.Frame, auth, nil
	}
	if auth == "" {
		auth = directory.BusAuthAPIKey
	}
	f := wire.NewIntentFrame(row.Sender, row.Recipient, row.Intent, json.RawMessage(row.Payload), admitted)
	f.Nonce = row.Nonce
	raw, err := f.DeliveryJSON()
	if err != nil {
		return nil, "", fmt.Errorf("build the frame: %w", err)
	}
	return raw, auth, nil
}

// unknownRecipient is the refusal of a send to an agent that is neither
// local nor served by a pinned peer. With federation it says so: messages
// are not forwarded through an intermediate directory, so a domain this
// directory does not peer with cannot be reached.
func (b *Bus) unknownRecipient(to string) *httpjson.Error {
	if b.remoteRouter() == nil {
		return httpjson.Errorf(http.StatusNotFound, codeUnknownAgent, "recipient %s is not registered here", to)
	}
	return httpjson.Errorf(http.StatusNotFound, codeUnknownAgent,
		"recipient %s is not registered here and no pinned peer directory serves its domain "+
			"(federation does not forward through intermediate directories: pin its directory as a peer)", to)
}
