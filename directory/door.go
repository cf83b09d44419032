package directory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// The one door into a session. Every owner of a nonce other than the relay
// itself — the message bus, the pipeline gateway — hands its frames to
// their recipients through Deliver: one operation that applies the
// recipient's policy (checkRecipient, the relay's own rules) on every
// path, attests a frame its sender did not sign, and reports how the
// attempt ended. The owner appends every event of its nonce, delivered
// included (Owner); the directory appends none of them.

// Path is how a Delivery reaches its recipient.
type Path int

const (
	// pathSession hands the frame to the recipient's WebSocket session on
	// this node, or on the node of the cluster that holds it.
	pathSession Path = iota
	// PathDirectHTTP POSTs the frame to the recipient's HTTP endpoint
	// (Delivery.Endpoint) exactly as the relay's direct-HTTP path does.
	PathDirectHTTP
	// PathPeer relays the frame, unsigned and from an agent of this
	// directory whom the caller authenticated, to its recipient in a peer
	// directory: an intent of its own nonce, which the directory owns and
	// traces (received with transport OriginMesh, dispatched over
	// federation, the peer's outcome); the peer delivers it attested.
	PathPeer
)

// Errors of a Delivery that did not start (Outcome.Err); the owner may try
// again later without counting an attempt.
var (
	// ErrRecipientOffline: the recipient has no session here or on another
	// node of the cluster.
	ErrRecipientOffline = errors.New("directory: recipient has no session")
	// ErrNonceBusy: this process is doing something else with the nonce
	// right now (a replay check of a POST /intents/send with the same nonce).
	ErrNonceBusy = errors.New("directory: nonce is busy")
)

// Owner is the owner of a delivered nonce: it appends every event of it.
type Owner interface {
	// Delivered appends delivered for frames written to their recipients'
	// sessions, in one append when it can: the directory gathers the
	// written frames of many deliveries (Config.DeliveredDelay) and calls
	// it on its recorder goroutine. An error means none of them was
	// recorded; the directory then tries each one alone. It must not wait
	// for the outcome of any delivery.
	Delivered(ws []Written) error
}

// Written is a frame of a Delivery that its recipient's session wrote.
type Written struct {
	// Nonce, From, To, Intent and Attempt identify the attempt.
	Nonce, From, To, Intent string
	Attempt                 int
	// MessageID is the Delivery's MessageID.
	MessageID string
}

// DeliveredEvents returns the delivered events of ws, for their owner to
// append.
func DeliveredEvents(ws []Written) []tracing.Event {
	events := make([]tracing.Event, len(ws))
	for i, w := range ws {
		events[i] = tracing.Event{Nonce: w.Nonce, State: tracing.Delivered, From: w.From, To: w.To,
			IntentType: w.Intent, Transport: TransportWS, Attempt: w.Attempt}
	}
	return events
}

// Delivery is one attempt to hand a frame to its recipient on behalf of the
// owner of its nonce, which has recorded the attempt's dispatch.
type Delivery struct {
	// Frame is the frame to deliver: a signed frame as the sender sent it,
	// or an unsigned frame the owner built for this attempt, which the
	// directory attests (Auth says how the sender was authenticated).
	Frame *wire.IntentFrame
	// SenderKey is the sender's public key (base64 SPKI DER), sent as
	// senderPublicKey with a sender-signed frame.
	SenderKey string
	// Auth is how the owner authenticated the frame's sender (BusAuth*).
	Auth string
	// Author is the agent whose choice sends the frame to its recipient,
	// whom the recipient's policy judges: the frame's sender when empty,
	// the route's author for a pipeline hop.
	Author string
	// Path is how the frame reaches its recipient.
	Path Path
	// Endpoint is the recipient's HTTP endpoint (PathDirectHTTP).
	Endpoint string
	// MessageID and Attempt go into the "bus" member of a WebSocket
	// delivery (pathSession).
	MessageID string
	Attempt   int
	// Timeout is how long to wait for the recipient's result after the frame
	// was queued (pathSession, PathPeer); its expiry ends the attempt with
	// TIMEOUT. Default Config.WSTimeout.
	Timeout time.Duration
	// Owner appends the delivered event of a frame written to a session
	// (pathSession); required there.
	Owner Owner
	// Done is called exactly once with how the attempt ended, possibly
	// before Deliver returns — unless the directory closes while the
	// attempt waits for a session's result (the log then keeps the owner's
	// last event and the owner's startup recovery settles it).
	Done func(Outcome)

	// handed: another node of the cluster handed the frame over; it is
	// never handed on.
	handed bool
}

// Outcome is how a Delivery ended.
type Outcome struct {
	// Err, when set, says that the delivery did not start
	// (ErrRecipientOffline, ErrNonceBusy, or a frame that cannot be
	// delivered): no attempt was made.
	Err error
	// Result is the recipient's result frame; nil when the attempt failed
	// without one.
	Result *wire.ResultFrame
	// Delivered reports that the owner committed delivered for this attempt
	// (Owner.Delivered).
	Delivered bool
	// Written reports that the frame was written to the recipient but its
	// delivered event was not recorded yet (the outcome came first): the
	// owner records delivered in the same append as the outcome.
	Written bool
	// ErrorCode and Error describe a failure without result: TIMEOUT,
	// DELIVERY_FAILED, DIRECT_HTTP_FAILED, or the recipient's policy
	// (FORBIDDEN, SENDER_SIGNATURE_REQUIRED).
	ErrorCode string
	Error     string
	// SessionProtocol is what the recipient's session spoke (beam/1 or
	// beam/2) and SessionAuth how it proved its identity (legacy,
	// api_key, signature), for a failure after the frame was handed to it.
	SessionProtocol string
	SessionAuth     string
	// Recorded, when set, says the attempt was not delivered: the node
	// holding the recipient's session found the cluster's delivery record
	// of the message (the recipient acknowledged it in an earlier attempt).
	// Its Node is that node and its Result the recorded result, if kept.
	Recorded *DeliveryRecord
}

// ownedAttempt is the owner's part of an inflight: the Delivery and its
// once.
type ownedAttempt struct {
	del  Delivery
	once sync.Once
}

func (a *ownedAttempt) finish(o Outcome) {
	a.once.Do(func() {
		if a.del.Done != nil {
			a.del.Done(o)
		}
	})
}

// Deliver hands one attempt of an owner's frame to its recipient along
// del.Path, after the recipient's policy admitted it, and reports how it
// ended through del.Done.
func (d *Directory) Deliver(ctx context.Context, del Delivery) {
	a := &ownedAttempt{del: del}
	f := del.Frame
	if f == nil {
		a.finish(Outcome{Err: errors.New("directory: deliver: nil frame")})
		return
	}
	author := del.Author
	if author == "" {
		author = f.From
	}
	if code, msg := d.checkRecipient(author, f.To, f.Intent, f.Signature != "", del.Auth); code != "" {
		a.finish(Outcome{ErrorCode: code, Error: msg})
		return
	}
	switch del.Path {
	case PathDirectHTTP:
		d.goDeliver(func() { a.finish(d.deliverDirect(f, del.Auth, del.Endpoint)) })
	case PathPeer:
		d.goDeliver(func() { a.finish(d.deliverPeer(ctx, f, del.Timeout)) })
	default:
		d.deliverSession(a)
	}
}

// goDeliver runs f in a goroutine Close waits for.
func (d *Directory) goDeliver(f func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
}

// checkRecipient applies a local recipient's policy to a frame that author
// chose to send to it: its ACL rules as checkPolicy applies them to every
// relayed intent, and its end-to-end rule — a recipient that requires
// sender signatures gets no attested frame (signed false), except a
// pipeline hop when it accepts attested hops. It returns "" when the frame
// may be delivered, else the relay's code and message.
func (d *Directory) checkRecipient(author, to, intent string, signed bool, auth string) (code, msg string) {
	if code, msg := d.checkPolicy(author, to, intent); code != "" {
		return code, msg
	}
	if signed {
		return "", ""
	}
	a, ok := d.reg.Get(to)
	if !ok || !a.RequireSenderSignatures {
		return "", ""
	}
	if intent != pipelineHopIntent {
		return CodeSenderSignatureRequired, SenderSignatureRequired(to, auth)
	}
	if a.AcceptAttestedPipelineHops {
		return "", ""
	}
	return CodeSenderSignatureRequired, SenderSignatureRequired(to, "a pipeline hop") +
		" (or turn on its acceptAttestedPipelineHops setting)"
}

// CheckDelivery is the policy Deliver applies (checkRecipient), for an
// owner that hands a frame to its recipient by another way than the door:
// the bus's poll leases, which the recipient takes over HTTP. author chose
// to send the frame to to; signed says whether the sender signed it, auth
// how the owner authenticated the sender of an unsigned one. It returns ""
// when the frame may be handed out, else the relay's code (FORBIDDEN,
// SENDER_SIGNATURE_REQUIRED) and message.
func (d *Directory) CheckDelivery(author, to, intent string, signed bool, auth string) (code, msg string) {
	return d.checkRecipient(author, to, intent, signed, auth)
}

// CheckPipelineHop is the policy Deliver applies to a pipeline hop to a
// local actor to (checkRecipient), with author as the sender: the agent
// that chose the hop, which is the envelope's creator for the route it gave
// and the actor that last rewrote next for the hops it named. No agent
// signs a hop (the directory attests it), so an actor that requires sender
// signatures receives one only when it accepts attested pipeline hops. The
// pipeline gateway asks it before it records a hop's dispatch. It returns
// "" when the hop may be delivered, else the relay's code (FORBIDDEN,
// SENDER_SIGNATURE_REQUIRED) and message.
func (d *Directory) CheckPipelineHop(author, to, intent string) (code, msg string) {
	return d.checkRecipient(author, to, intent, false, "a pipeline hop")
}

// deliverSession hands a's frame to the recipient's WebSocket session, here
// or on the node of the cluster that holds it.
func (d *Directory) deliverSession(a *ownedAttempt) {
	del := a.del
	f := del.Frame
	if !d.reg.Serves(f.To) {
		// A stale registration in a pinned peer's domain: that peer's
		// agent is the only recipient of the name.
		a.finish(Outcome{Err: fmt.Errorf("%w: %s is in a domain this directory does not serve", ErrRecipientOffline, f.To)})
		return
	}
	s := d.session(f.To)
	if s == nil && !del.handed && d.handSession(a) {
		return
	}
	if s == nil {
		a.finish(Outcome{Err: ErrRecipientOffline})
		return
	}
	h, err := d.handOver(f, del.SenderKey, "", del.Auth, "")
	var msg []byte
	if err == nil {
		msg, err = h.message()
	}
	if err == nil {
		msg, err = withBusMember(msg, BusMark{MessageID: del.MessageID, Attempt: del.Attempt, Auth: del.Auth})
	}
	if err != nil {
		a.finish(Outcome{Err: fmt.Errorf("directory: deliver %s: %w", f.Nonce, err)})
		return
	}
	timeout := del.Timeout
	if timeout <= 0 {
		timeout = d.cfg.WSTimeout
	}
	inf := &inflight{
		nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, origin: transportBus,
		attempt: del.Attempt, timeout: timeout, start: d.clock(), t0: time.Now(),
		done: func([]byte, *RelayError) {}, owned: a,
	}
	if rerr := d.claim(inf); rerr != nil {
		a.finish(Outcome{Err: ErrNonceBusy})
		return
	}
	// The owner recorded dispatched before this call: the nonce left received.
	d.forgetBusReceived(f.Nonce)
	d.mu.Lock()
	inf.transport = TransportWS
	inf.waiting = true
	inf.recipient = s
	inf.timer = time.AfterFunc(timeout, func() { d.expire(inf) })
	d.mu.Unlock()
	if !s.enqueue(outMsg{data: msg, inf: inf}) {
		d.undelivered(inf, fmt.Sprintf("session of %s closed before delivery", f.To))
	}
}

// ownedFailed ends an owner's session attempt that failed without a result
// (called by fail; nothing is recorded here).
func (d *Directory) ownedFailed(inf *inflight, code, msg string) {
	d.mu.Lock()
	delivered, written, s := inf.delivered, inf.needDelivered, inf.recipient
	d.mu.Unlock()
	d.release(inf)
	o := Outcome{Delivered: delivered, Written: written, ErrorCode: code, Error: msg}
	if s != nil {
		o.SessionProtocol, o.SessionAuth = s.protocol(), s.auth
		if code == CodeTimeout {
			// No session kind acknowledges receipt: silence is all the
			// owner knows, and it must not be read as success.
			o.Error = fmt.Sprintf("Recipient %s did not answer attempt %d within %s; its %s session (auth %s) "+
				"cannot acknowledge receipt, so it may have rejected the frame", inf.to, inf.attempt, inf.timeout,
				o.SessionProtocol, o.SessionAuth)
		}
	}
	inf.owned.finish(o)
}

// ownedResult ends an owner's session attempt with the recipient's result
// (called by finishWithResult).
func (d *Directory) ownedResult(inf *inflight, rf *wire.ResultFrame) {
	d.mu.Lock()
	delivered, written := inf.delivered, inf.needDelivered
	d.mu.Unlock()
	d.release(inf)
	inf.owned.finish(Outcome{Delivered: delivered, Written: written, Result: rf})
}

// written is what inf's owner is told about its written frame.
func (inf *inflight) written() Written {
	w := Written{Nonce: inf.nonce, From: inf.from, To: inf.to, Intent: inf.intentType, Attempt: inf.attempt}
	if inf.owned != nil {
		w.MessageID = inf.owned.del.MessageID
	}
	return w
}

// deliverDirect POSTs f to an agent's direct HTTP endpoint exactly as the
// relay's direct-HTTP path does (same body, headers, timeout and response
// mapping, and the same attestation of an unsigned frame, auth saying how
// its sender was authenticated): the recipient's result, or
// DIRECT_HTTP_FAILED with the same sanitized category the relay gives (the
// full error goes to the server's log only).
func (d *Directory) deliverDirect(f *wire.IntentFrame, auth, endpoint string) Outcome {
	inf := &inflight{nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, origin: transportBus,
		start: d.clock()}
	h, err := d.handOver(f, "", "", auth, "")
	if err != nil {
		return Outcome{ErrorCode: CodeInvalidIntent, Error: fmt.Sprintf("frame cannot be delivered: %v", err)}
	}
	rf, err := d.postDirect(inf, h, endpoint)
	if err != nil {
		_, msg := d.directFailed(f.Nonce, f.To, err)
		return Outcome{ErrorCode: codeDirectHTTPFailed, Error: msg}
	}
	return Outcome{Result: rf}
}

// deliverPeer relays f to its recipient in a peer directory (PathPeer) and
// waits up to timeout for the recipient's result frame (success or
// failure) or the relay's error.
func (d *Directory) deliverPeer(ctx context.Context, f *wire.IntentFrame, timeout time.Duration) Outcome {
	res, rerr := d.Relay(ctx, f, RelayOptions{Origin: OriginMesh, allowUnsigned: true, Timeout: timeout})
	if rerr != nil {
		return Outcome{ErrorCode: rerr.Code, Error: rerr.Message}
	}
	rf, err := wire.DecodeResultFrame(res)
	if err != nil {
		return Outcome{ErrorCode: CodeRelayError, Error: fmt.Sprintf("the peer's result frame cannot be read: %v", err)}
	}
	return Outcome{Result: rf}
}

// ownDelivered is the directory as the owner of the nonces it relays: it
// appends their delivered events itself.
type ownDelivered struct{ d *Directory }

// Delivered appends delivered for the directory's own written frames.
func (o ownDelivered) Delivered(ws []Written) error {
	return o.d.append(DeliveredEvents(ws)...)
}
