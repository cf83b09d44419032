package bus

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// CodeSignedFrameRequired: a durable send to an agent of a peer directory
// was not a sender-signed beam/1 frame. The peer verifies the agent's
// signature on the frame, which the bus forwards verbatim.
const CodeSignedFrameRequired = "SIGNED_FRAME_REQUIRED"

// Remote is the federation router through which the bus sends to agents of
// peer directories (federation.Node implements it). The bus needs it only
// as this interface, so it does not import federation.
type Remote interface {
	// PeerFor returns the pinned peer directory serving the Beam ID to.
	PeerFor(to string) (peer string, ok bool)
	// Forward records events (ending with the dispatched event) and the
	// outbox row carrying the frame to the peer in one log transaction.
	Forward(ctx context.Context, req directory.ForwardRequest, events ...tracing.Event) error
	// SetBusOutcome registers fn, called with the nonce after the peer's
	// outcome of a bus-owned intent (delivered, acked, failed, or
	// dead_letter when the outbox row dies) is committed in the log.
	SetBusOutcome(fn func(nonce string))
}

// SetRemote installs the federation router: from now on a message whose
// recipient is not a local agent but is served by a pinned peer is
// forwarded through it instead of being refused. Call it before Start
// (nil removes it).
func (b *Bus) SetRemote(r Remote) {
	b.mu.Lock()
	b.remote = r
	b.mu.Unlock()
	if r != nil {
		r.SetBusOutcome(b.remoteOutcome)
	}
}

func (b *Bus) remoteRouter() Remote {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.remote
}

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

// checkRemoteSend refuses a send to a peer's agent that the peer could not
// authenticate: only a sender-signed beam/1 frame is forwarded.
func checkRemoteSend(req *sendRequest, peer string) *apiError {
	if req.auth == directory.BusAuthSignature && req.frame != nil {
		return nil
	}
	return errf(http.StatusBadRequest, CodeSignedFrameRequired,
		"%s is served by the peer directory %s: a durable send to it must be a frame signed by %s (the peer verifies the signature); %s authentication cannot be forwarded",
		req.to, peer, req.from, req.auth)
}

// forward starts attempt prev+1 of row through the federation outbox: the
// dispatched event (transport federation, details.peer) and the outbox row
// are committed together, and the relay publishes the sender's signed frame
// verbatim until the peer answers. The caller holds the nonce's lock.
func (b *Bus) forward(r Remote, peer string, row tracing.MessageRow, first tracing.Details, prev int) error {
	auth, _ := first.Extra["auth"].(string)
	if auth != directory.BusAuthSignature || len(first.Frame) == 0 {
		return b.retry(row, prev, transportBus, CodeSignedFrameRequired,
			"recipient "+row.Recipient+" is served by the peer directory "+peer+"; only a sender-signed frame can be forwarded",
			nil, map[string]any{"peer": peer}, nil, false)
	}
	n := prev + 1
	disp := event(row, tracing.Dispatched, directory.TransportFederation, n)
	disp.Details.TimeoutMs = b.cfg.DeliveryTimeout.Milliseconds()
	disp.Details.Extra = map[string]any{"peer": peer, "hop": 1}
	req := directory.ForwardRequest{
		Nonce: row.Nonce, From: row.Sender, To: row.Recipient, IntentType: row.Intent,
		Frame: first.Frame, Peer: peer, Owner: tracing.OwnerBus, Attempt: n, Timeout: b.cfg.DeliveryTimeout,
		Admitted: time.UnixMicro(int64(row.CreatedAt * 1e6)),
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

// remoteOutcome runs after federation committed the peer's outcome of a
// forwarded message: it updates the metrics, wakes a waiting send and
// tells a connected sender how the message ended.
func (b *Bus) remoteOutcome(nonce string) {
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
		b.onDelivered(row)
		b.m.outcomes.WithLabelValues("accepted").Inc()
	case tracing.Acked:
		b.onDelivered(row)
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
