package directory

import (
	"encoding/json"
	"fmt"

	"github.com/beamdir/beam/agents/wire"
)

// This file is the directory's side of the message bus (package bus): the
// bus owns its messages' lifecycle, and the directory lends it its sessions
// (bounded send queues, results accepted only from the addressed
// recipient's current session, door.go) without recording anything of its
// nonces.

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

// transportBus is the origin recorded for frames the bus hands the
// directory; it never appears on events the directory writes itself.
const transportBus = "bus"

// sessionOwner is what the owners of the nonces the directory does not own
// — the message bus, the pipeline gateway — hear of its sessions. The
// directory knows them only as this interface (Config.Owners).
type sessionOwner interface {
	// Connected is called (in its own goroutine) after beamID attached a
	// session here, or on another node of the cluster: its waiting work
	// may go now.
	Connected(beamID string)
	// LateResult is called with a result beamID sent for a nonce another
	// owner holds that no Delivery waits for (the attempt timed out, or
	// the process restarted). It reports whether an owner took it.
	LateResult(beamID string, rf *wire.ResultFrame) bool
}

// ownersConnected tells the owners of other nonces that beamID attached a
// session.
func (d *Directory) ownersConnected(beamID string) {
	if o := d.cfg.Owners; o != nil {
		go o.Connected(beamID)
	}
}

// ownersLateResult hands a result for a nonce the directory does not own to
// the owners.
func (d *Directory) ownersLateResult(beamID string, rf *wire.ResultFrame) bool {
	if o := d.cfg.Owners; o != nil {
		return o.LateResult(beamID, rf)
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
	inf := &inflight{nonce: nonce, from: from, to: to, intentType: intent, origin: transportBus,
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

// NotifyAgent queues msg (a complete WebSocket message) on beamID's session.
// It reports false when the agent has no session or its queue is full.
func (d *Directory) NotifyAgent(beamID string, msg []byte) bool {
	s := d.session(beamID)
	if s == nil {
		return false
	}
	return s.enqueue(outMsg{data: msg})
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
