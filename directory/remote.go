package directory

import (
	"context"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// OriginFederation marks a frame that a peer directory forwarded; it is the
// transport of the received event on the target directory.
const OriginFederation = "federation"

// TransportFederation is the transport of events of an intent handed to a
// peer directory.
const TransportFederation = "federation"

// Remote routes intents whose recipient lives in a peer directory. The
// federation package implements it (federation.Router); Config.Remote
// gives it to the directory.
type Remote interface {
	// PeerFor returns the domain of the peer directory that serves the Beam
	// ID to, or false when no pinned peer does.
	PeerFor(to string) (peer string, ok bool)
	// Forward records events (ending with the dispatched event) and, in the
	// same log transaction, the outbox row that carries the frame to the
	// peer. It returns once both are committed.
	Forward(ctx context.Context, req ForwardRequest, events ...tracing.Event) error
}

// ForwardRequest is an intent handed to a peer directory.
type ForwardRequest struct {
	// Nonce, From, To and IntentType identify the intent.
	Nonce, From, To, IntentType string
	// Frame is the agent's frame exactly as it arrived.
	Frame []byte
	// Peer is the domain of the target directory.
	Peer string
	// Owner drives the intent (directory for sync callers, bus for durable
	// sends).
	Owner tracing.Owner
	// Attempt is the intent's attempt number.
	Attempt int
	// Timeout is the result timeout of the attempt.
	Timeout time.Duration
	// Deadline, when set, is when the sender stops waiting: the outbox row
	// is dead after it. Zero for durable sends.
	Deadline time.Time
	// Admitted is when this directory admitted the frame (its timestamp was
	// checked against the replay window then). A durable send may reach the
	// peer long after the frame's timestamp; the peer checks the window
	// against this instant, which the origin's signature vouches for.
	Admitted time.Time
	// VouchedAuth is how this directory authenticated the sender of an
	// unsigned frame (api-key, bus-key, jws): the peer delivers such a
	// frame attested, vouched for by this directory. Empty for a frame
	// the sender signed.
	VouchedAuth string
	// JWS is the sender's beam/2 envelope of a beam/2 intent (Frame is its
	// payload); it travels with the frame so that the recipient verifies
	// it end to end.
	JWS string
}

// linkReporter is a Remote that knows whether its link to a peer is down,
// and whether it has been down long enough to fail plain sends at once.
type linkReporter interface {
	LinkDown(peer string) bool
	LinkKnownDown(peer string) bool
}

// peerKnownDown reports whether the Remote's link to peer has been down for
// a while (no plain send can reach it now).
func (d *Directory) peerKnownDown(peer string) bool {
	lr, ok := d.remoteRouter().(linkReporter)
	return ok && lr.LinkKnownDown(peer)
}

// peerLinkDown reports whether the Remote knows its link to peer is down.
func (d *Directory) peerLinkDown(peer string) bool {
	lr, ok := d.remoteRouter().(linkReporter)
	return ok && lr.LinkDown(peer)
}

// remoteRouter returns the federation router; nil without federation.
func (d *Directory) remoteRouter() Remote { return d.cfg.Remote }

// routeRemote hands a validated intent whose recipient is served by a peer
// directory to federation. It reports false when the intent is not remote.
func (d *Directory) routeRemote(inf *inflight, f *wire.IntentFrame, pre []tracing.Event) bool {
	r := d.remoteRouter()
	if r == nil {
		return false
	}
	if _, local := d.reg.Get(f.To); local && d.reg.Serves(f.To) {
		return false
	}
	peer, ok := r.PeerFor(f.To)
	if !ok {
		return false
	}
	if inf.owned == nil && d.peerKnownDown(peer) {
		// Nothing is sent: a plain send would only wait for its timeout.
		d.fail(inf, pre, CodeDeliveryFailed, fmt.Sprintf("Not sent to %s: its directory %s is unreachable from this one (no connection to it). "+
			"Check that it is running (beam peer list on this directory shows the link), then send again, "+
			"or send with --durable to have it delivered when %s is back", inf.to, peer, peer), true, map[string]any{"peer": peer})
		return true
	}
	frame := f.Raw
	if len(frame) == 0 {
		var err error
		if frame, err = f.DeliveryJSON(); err != nil {
			d.fail(inf, pre, CodeInvalidIntent, fmt.Sprintf("frame cannot be forwarded: %v", err), false, nil)
			return true
		}
	}
	ev := inf.event(tracing.Dispatched, TransportFederation)
	ev.Details = tracing.Details{TimeoutMs: inf.timeout.Milliseconds(), Extra: map[string]any{"peer": peer, "hop": 1}}
	// The waiter exists before the row is committed: the peer may answer
	// before Forward returns.
	d.mu.Lock()
	inf.transport = TransportFederation
	inf.peer = peer
	inf.waiting = true
	inf.timer = time.AfterFunc(inf.timeout, func() { d.expire(inf) })
	d.mu.Unlock()
	req := ForwardRequest{
		Nonce: inf.nonce, From: inf.from, To: inf.to, IntentType: inf.intentType,
		Frame: frame, Peer: peer, Owner: tracing.OwnerDirectory, Attempt: inf.attempt,
		Timeout: inf.timeout, Deadline: inf.start.Add(inf.timeout), JWS: inf.jws,
	}
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	if err := r.Forward(ctx, req, append(pre, ev)...); err != nil {
		if d.settle(inf) {
			d.abort(inf, fmt.Errorf("forward to %s: %w", peer, err))
		}
	}
	return true
}

// SettleRemote ends this process's wait for the result of a forwarded
// intent so that the caller alone records its outcome. finish hands the
// outcome to the waiting sender and releases the nonce; call it after the
// outcome is committed. waited is false (and finish a no-op) when no sender
// of this process waits for nonce any more (a timeout came first, or the
// intent was sent before a restart).
func (d *Directory) SettleRemote(nonce string) (finish func(res []byte, rerr *RelayError), waited bool) {
	d.mu.Lock()
	inf := d.claims[nonce]
	ok := inf != nil && inf.waiting && inf.transport == TransportFederation
	d.mu.Unlock()
	if !ok || !d.settle(inf) {
		return func([]byte, *RelayError) {}, false
	}
	return func(res []byte, rerr *RelayError) {
		d.release(inf)
		switch {
		case rerr != nil:
			d.m.relayed.WithLabelValues(outcomeFailed).Inc()
		default:
			d.m.relayed.WithLabelValues(outcomeAcked).Inc()
		}
		inf.done(res, rerr)
	}, true
}

// RemoteSender builds the sender of a frame forwarded by a peer directory
// from the public key its home directory vouched for.
func RemoteSender(beamID string, pub []byte) registry.Agent {
	return registry.Agent{BeamID: beamID, PublicKey: pub, PublicKeyB64: wire.EncodePublicKey(pub)}
}

// NoteRemoteResultJWS hands the recipient's beam/2 result JWS of a
// forwarded intent to its waiting sender (call it before the finish of
// SettleRemote); it does nothing when no sender of this process waits.
func (d *Directory) NoteRemoteResultJWS(nonce, token string) {
	d.mu.Lock()
	inf := d.claims[nonce]
	d.mu.Unlock()
	if inf != nil && inf.resultJWS != nil && token != "" {
		inf.resultJWS.set(token)
	}
}
