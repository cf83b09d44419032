package directory

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// This file is the directory's side of the message bus (package bus): the
// bus owns its messages' lifecycle, and the directory lends it its sessions
// (bounded send queues, results accepted only from the addressed
// recipient's current session) without recording anything but the
// delivered event its session writers record for every frame they write.

// Ways the bus authenticated a message's sender. They travel in the "bus"
// member of a delivered intent message, outside the frame.
const (
	// BusAuthSignature: the sender signed the frame (beam/1); it is
	// forwarded verbatim and its signature verifies.
	BusAuthSignature = "signature"
	// BusAuthJWS: the sender signed a beam/2 JWS; the delivered beam/1
	// frame is attested by the directory (wire.AttestJWS).
	BusAuthJWS = wire.AttestJWS
	// BusAuthAPIKey: the sender presented its API key; the frame is
	// attested by the directory (wire.AttestAPIKey).
	BusAuthAPIKey = wire.AttestAPIKey
	// BusAuthBusKey: a trusted back-end sent with the operator bus key on
	// behalf of a local agent; the frame is attested by the directory
	// (wire.AttestBusKey).
	BusAuthBusKey = wire.AttestBusKey
)

// TransportBus is the origin recorded for frames the bus hands the
// directory; it never appears on events the directory writes itself.
const TransportBus = "bus"

// Errors of DeliverBus.
var (
	// ErrBusRecipientOffline: the recipient has no session here.
	ErrBusRecipientOffline = errors.New("directory: bus recipient has no session")
	// ErrBusNonceBusy: this process is doing something else with the nonce
	// right now (a replay check of a POST /intents/send with the same nonce).
	ErrBusNonceBusy = errors.New("directory: bus nonce is busy")
)

// BusDelivery is one delivery attempt of a bus message to the recipient's
// WebSocket session. The bus has recorded dispatched before calling
// DeliverBus.
type BusDelivery struct {
	// Frame is the frame to deliver: a signed frame as the sender sent it,
	// or an unsigned frame the bus built for this attempt, which the
	// directory attests (Auth says how the sender was authenticated).
	Frame *wire.IntentFrame
	// SenderKey is the sender's public key (base64 SPKI DER), sent as
	// senderPublicKey with a sender-signed frame.
	SenderKey string
	// MessageID, Attempt and Auth go into the "bus" member of the message.
	MessageID string
	Attempt   int
	Auth      string
	// Timeout is how long to wait for the recipient's result after the frame
	// was queued; its expiry ends the attempt with TIMEOUT.
	Timeout time.Duration
	// OnDelivered, when set, is called once delivered is committed (on the
	// session's writer goroutine: it must not block).
	OnDelivered func()
	// OnOutcome is called exactly once with how the attempt ended, unless
	// the directory closes first (the log then keeps dispatched or
	// delivered and the bus's startup recovery settles it).
	OnOutcome func(BusOutcome)
}

// BusOutcome is how a bus delivery attempt ended.
type BusOutcome struct {
	// Result is the recipient's result frame; nil when the attempt failed
	// without one.
	Result *wire.ResultFrame
	// Delivered reports that delivered was committed for this attempt.
	Delivered bool
	// Written reports that the frame was written to the recipient but its
	// delivered event was not recorded yet (the outcome came first): the
	// bus records delivered in the same append as the outcome.
	Written bool
	// ErrorCode and Error describe a failure without result: TIMEOUT or
	// DELIVERY_FAILED.
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

// BusHooks are the bus's callbacks into the directory's events.
type BusHooks struct {
	// Connected is called (in its own goroutine) after an agent's session
	// is attached.
	Connected func(beamID string)
	// LateResult is called for a result sent by beamID for a bus-owned
	// nonce that no attempt of this process waits for (the attempt timed
	// out, or the process restarted). It reports whether the bus took it.
	LateResult func(beamID string, rf *wire.ResultFrame) bool
}

// busHookSlot holds the hooks set by SetBusHooks.
type busHookSlot struct {
	p atomic.Pointer[BusHooks]
}

// busAttempt is the bus's part of an inflight: the callbacks of a
// DeliverBus attempt.
type busAttempt struct {
	del  BusDelivery
	once sync.Once
}

func (a *busAttempt) finish(o BusOutcome) {
	a.once.Do(func() {
		if a.del.OnOutcome != nil {
			a.del.OnOutcome(o)
		}
	})
}

// SetBusHooks installs the message bus's callbacks. Call it before serving.
func (d *Directory) SetBusHooks(h BusHooks) {
	d.busHooks.p.Store(&h)
}

// busConnected tells the bus (and the pipeline gateway) that beamID
// attached a session.
func (d *Directory) busConnected(beamID string) {
	if h := d.busHooks.p.Load(); h != nil && h.Connected != nil {
		go h.Connected(beamID)
	}
	d.meshConnected(beamID)
}

// busLateResult hands a result for a bus-owned nonce to the bus.
func (d *Directory) busLateResult(beamID string, rf *wire.ResultFrame) bool {
	if h := d.busHooks.p.Load(); h != nil && h.LateResult != nil {
		return h.LateResult(beamID, rf)
	}
	return false
}

// MaxFrameBytes returns the largest delivered frame recipients accept.
func (d *Directory) MaxFrameBytes() int { return d.cfg.MaxFrameBytes }

// ClaimBusNonce claims nonce in this process, as a frame being relayed
// would, so that no POST /intents/send with the same nonce starts while the
// bus records a new message. It returns the release function, or the
// RelayError (IN_PROGRESS, NONCE_REUSE_CONFLICT) saying why the nonce is
// busy.
func (d *Directory) ClaimBusNonce(nonce, from, to, intent string) (func(), *RelayError) {
	release, _, rerr := d.ClaimNewBusNonce(nonce, from, to, intent)
	return release, rerr
}

// ClaimNewBusNonce is ClaimBusNonce that also reports whether the log may
// hold nonce in received (the bus noted it before, or Recover found it
// there). When it may not, a received event of nonce needs no look-up
// first: the log refuses it if the nonce has any other state (see
// busnonces.go), exactly as it refuses the relay's optimistic received.
func (d *Directory) ClaimNewBusNonce(nonce, from, to, intent string) (release func(), lookup bool, rerr *RelayError) {
	inf := &inflight{nonce: nonce, from: from, to: to, intentType: intent, origin: TransportBus,
		done: func([]byte, *RelayError) {}}
	d.mu.Lock()
	rerr = d.claimLocked(inf)
	if rerr == nil {
		_, lookup = d.busRecv[nonce]
		// The bus is about to record the nonce as received.
		d.noteBusReceived(nonce)
	}
	d.mu.Unlock()
	if rerr != nil {
		return nil, false, rerr
	}
	if rerr := d.claimClusterBusNonce(from, nonce); rerr != nil {
		d.release(inf)
		return nil, false, rerr
	}
	return func() { d.release(inf) }, lookup, nil
}

// DeliverBus hands one attempt of a bus message to its recipient's session.
// It returns ErrBusRecipientOffline or ErrBusNonceBusy without calling
// OnOutcome; otherwise OnOutcome follows (result, TIMEOUT after
// del.Timeout, or DELIVERY_FAILED when the session closes first).
func (d *Directory) DeliverBus(del BusDelivery) error {
	f := del.Frame
	if f == nil {
		return errors.New("directory: deliver bus: nil frame")
	}
	if !d.reg.Serves(f.To) {
		// A stale registration in a pinned peer's domain: that peer's
		// agent is the only recipient of the name.
		return fmt.Errorf("%w: %s is in a domain this directory does not serve", ErrBusRecipientOffline, f.To)
	}
	s := d.session(f.To)
	if s == nil && d.handBus(del) {
		return nil
	}
	if s == nil {
		return ErrBusRecipientOffline
	}
	h, err := d.handOver(f, del.SenderKey, "", del.Auth, "")
	var msg []byte
	if err == nil {
		msg, err = busIntentMessage(h, del)
	}
	if err != nil {
		return fmt.Errorf("directory: deliver bus %s: %w", f.Nonce, err)
	}
	timeout := del.Timeout
	if timeout <= 0 {
		timeout = d.cfg.WSTimeout
	}
	inf := &inflight{
		nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, origin: TransportBus,
		attempt: del.Attempt, timeout: timeout, start: d.clock(), t0: time.Now(),
		done: func([]byte, *RelayError) {}, bus: &busAttempt{del: del},
	}
	if rerr := d.claim(inf); rerr != nil {
		return ErrBusNonceBusy
	}
	// The bus recorded dispatched before this call: the nonce left received.
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
	return nil
}

// busFailed ends a bus attempt that failed without a result (called by
// fail for inflights of DeliverBus; nothing is recorded here).
func (d *Directory) busFailed(inf *inflight, code, msg string) {
	d.mu.Lock()
	delivered, written, s := inf.delivered, inf.needDelivered, inf.recipient
	d.mu.Unlock()
	d.release(inf)
	o := BusOutcome{Delivered: delivered, Written: written, ErrorCode: code, Error: msg}
	if s != nil {
		o.SessionProtocol, o.SessionAuth = s.protocol(), s.auth
		if code == CodeTimeout {
			// No session kind acknowledges receipt: silence is all the bus
			// knows, and it must not be read as success.
			o.Error = fmt.Sprintf("Recipient %s did not answer attempt %d within %s; its %s session (auth %s) "+
				"cannot acknowledge receipt, so it may have rejected the frame", inf.to, inf.attempt, inf.timeout,
				o.SessionProtocol, o.SessionAuth)
		}
	}
	inf.bus.finish(o)
}

// busResult ends a bus attempt with the recipient's result (called by
// finishWithResult for inflights of DeliverBus).
func (d *Directory) busResult(inf *inflight, rf *wire.ResultFrame) {
	d.mu.Lock()
	delivered, written := inf.delivered, inf.needDelivered
	d.mu.Unlock()
	d.release(inf)
	inf.bus.finish(BusOutcome{Delivered: delivered, Written: written, Result: rf})
}

// busDelivered reports a committed delivered event to the bus.
func (inf *inflight) busDelivered() {
	if inf.bus != nil && inf.bus.del.OnDelivered != nil {
		inf.bus.del.OnDelivered()
	}
}

// NotifyAgent queues msg (a complete WebSocket message) on beamID's session.
// It reports false when the agent has no session or its queue is full.
func (d *Directory) NotifyAgent(beamID string, msg []byte) bool {
	s := d.session(beamID)
	if s == nil {
		return false
	}
	return s.enqueue(outMsg{data: msg})
}

// busIntentMessage builds {"type":"intent","frame":…,"senderPublicKey":…,
// ["attestation":…,]"bus":{"messageId","attempt","auth"}}.
func busIntentMessage(h handOver, del BusDelivery) ([]byte, error) {
	base, err := h.message()
	if err != nil {
		return nil, err
	}
	return withBusMember(base, BusMark{MessageID: del.MessageID, Attempt: del.Attempt, Auth: del.Auth})
}

// BusMark is the "bus" member of a delivered bus message.
type BusMark struct {
	MessageID string `json:"messageId"`
	Attempt   int    `json:"attempt"`
	Auth      string `json:"auth"`
}

// withBusMember adds "bus": m to the intent message base.
func withBusMember(base []byte, m BusMark) ([]byte, error) {
	mark, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode bus member: %w", err)
	}
	out := make([]byte, 0, len(base)+len(mark)+8)
	out = append(out, base[:len(base)-1]...)
	out = append(out, `,"bus":`...)
	out = append(out, mark...)
	return append(out, '}'), nil
}
