package directory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// Cluster mode (federation/cluster): several nodes serve one domain. An
// intent for a local agent whose WebSocket session another node holds is
// handed to that node (NodeRouter): this node records received, validated
// and dispatched (transport "cluster", details.node), the other node relays
// the frame as it arrived to the session — with its own received …
// acked trace of the same nonce (origin "cluster", details.fromNode) —
// and the result comes back the same way, settling this node's trace.
// A handed-over frame is never handed over again.

// originCluster marks a frame another node of the cluster handed over.
const originCluster = "cluster"

// TransportCluster is the transport of events of an intent handed to
// another node of the cluster.
const TransportCluster = "cluster"

// NodeRouter reaches the other nodes of this directory's cluster.
type NodeRouter interface {
	// NodeFor returns the other node that holds beamID's session, or
	// false when none does (or this node does).
	NodeFor(beamID string) (node string, ok bool)
	// Hand relays h on node and returns node's answer. An error means node
	// could not be asked or did not answer in time.
	Hand(ctx context.Context, node string, h HandOver) (HandReply, error)
	// ClaimNonce records that this node accepts the nonce of from; false
	// when another node of the cluster accepted it first.
	ClaimNonce(ctx context.Context, from, nonce string) (bool, error)
	// SessionUp and SessionDown tell the cluster which sessions this node
	// holds.
	SessionUp(beamID string)
	SessionDown(beamID string)
	// RecordDelivery stores the record that a bus message's recipient
	// acknowledged it (cluster_delivery.go); Delivery reads the record of
	// from's nonce, ok false when there is none.
	RecordDelivery(ctx context.Context, rec DeliveryRecord) error
	Delivery(ctx context.Context, from, nonce string) (rec DeliveryRecord, ok bool, err error)
	// Joined reports whether this node joined its cluster, and when; the
	// router is used only once it has.
	Joined() (at time.Time, ok bool)
}

// HandOver is an intent handed from one node of the cluster to another.
type HandOver struct {
	// Frame is the frame as it arrived at the first node.
	Frame []byte `json:"frame"`
	// JWS is the beam/2 envelope it arrived in, if any.
	JWS string `json:"jws,omitempty"`
	// Unsigned: the first node authenticated the sender otherwise (API
	// key); the receiving node attests the delivery as it would.
	Unsigned bool `json:"unsigned,omitempty"`
	// VouchedBy is the peer directory vouching for an unsigned frame.
	VouchedBy string `json:"vouchedBy,omitempty"`
	// TimeoutMs is the remaining result timeout.
	TimeoutMs int64 `json:"timeoutMs"`
	// FromNode names the node that handed it over.
	FromNode string `json:"fromNode"`
	// Bus, for an attempt of a bus message, is the "bus" member the
	// holder delivers with the frame; Admitted is when the first node
	// admitted the message (the replay window is checked against it).
	Bus      *BusMark  `json:"bus,omitempty"`
	Admitted time.Time `json:"admitted,omitzero"`
	// Hop, for a pipeline hop, says that the holder hands the frame to the
	// actor's session through its own door (Deliver) for the owner, as the
	// owner would have: the owner traces the hop, the holder records
	// nothing.
	Hop *HopMark `json:"hop,omitempty"`
}

// HopMark is what the holder of an actor's session needs to deliver a
// pipeline hop another node owns.
type HopMark struct {
	// Author is the agent whose choice sends the hop (Delivery.Author),
	// whom the actor's policy judges.
	Author string `json:"author"`
	// Auth is how the owner authenticated the hop's sender (BusAuth*).
	Auth string `json:"auth"`
	// SenderKey is the sender's public key (Delivery.SenderKey).
	SenderKey string `json:"senderKey,omitempty"`
	// MessageID and Attempt are the envelope's ID and the attempt.
	MessageID string `json:"messageId"`
	Attempt   int    `json:"attempt"`
}

// nodeRouter returns the cluster's router once this node joined its
// cluster (Config.Cluster); nil without cluster mode or before.
func (d *Directory) nodeRouter() NodeRouter {
	r := d.cfg.Cluster
	if r == nil {
		return nil
	}
	if _, ok := r.Joined(); !ok {
		return nil
	}
	return r
}

// sessionChanged tells the cluster about a session this node attached or
// detached.
func (d *Directory) sessionChanged(beamID string, up bool) {
	r := d.nodeRouter()
	if r == nil {
		return
	}
	if up {
		r.SessionUp(beamID)
	} else {
		r.SessionDown(beamID)
	}
}

// RelayHandOver relays an intent another node of the cluster handed over
// to the session this node holds, and returns its outcome. A bus attempt
// whose message the recipient acknowledged already (the cluster's delivery
// record) is answered from the record, not delivered.
func (d *Directory) RelayHandOver(ctx context.Context, h HandOver) HandReply {
	f, err := wire.DecodeIntentFrame(h.Frame)
	if err != nil {
		return HandReply{Error: relayErr(CodeInvalidIntent, "", "handed-over frame: %v", err)}
	}
	if h.Hop != nil {
		return d.deliverHandedHop(ctx, f, h)
	}
	if h.Bus != nil && h.Bus.MessageID != "" && h.Bus.Attempt > 1 {
		// A first attempt cannot have been acknowledged before; only bus
		// messages (with an id) have records.
		if rep, ok := d.recordedHandOver(ctx, f, h.Bus); ok {
			return rep
		}
	}
	o := RelayOptions{Origin: originCluster, JWS: h.JWS, Timeout: time.Duration(h.TimeoutMs) * time.Millisecond,
		Extra: map[string]any{"fromNode": h.FromNode}}
	if h.Unsigned {
		o.allowUnsigned, o.vouchedBy = true, h.VouchedBy
	}
	if h.Bus != nil {
		mark := *h.Bus
		o.busMark, o.AdmittedAt = &mark, h.Admitted
		o.Extra["busMessageId"] = mark.MessageID
	}
	res, rerr := d.Relay(ctx, f, o)
	return HandReply{Result: res, Error: rerr}
}

// attestAuth is how the sender of inf was authenticated, as an
// attestation of its delivery says.
func (inf *inflight) attestAuth() string {
	if m := inf.busMark; m != nil && m.Auth != "" && m.Auth != BusAuthSignature {
		return m.Auth
	}
	return attestAuth(inf.vouchedBy)
}

// RemoteSessionUp tells the owners of other nonces (Config.Owners) that
// another node of the cluster now holds beamID's session, so that messages
// and hops waiting here for it go there.
func (d *Directory) RemoteSessionUp(beamID string) { d.ownersConnected(beamID) }

// handSession hands an owner's session attempt for a recipient another
// node holds to that node; the outcome comes back through a. It reports
// false when no other node holds the recipient.
func (d *Directory) handSession(a *ownedAttempt) bool {
	r := d.nodeRouter()
	if r == nil {
		return false
	}
	del := a.del
	f := del.Frame
	node, ok := r.NodeFor(f.To)
	if !ok {
		return false
	}
	frame, err := frameBytes(f)
	if err != nil {
		return false
	}
	timeout := del.Timeout
	if timeout <= 0 {
		timeout = d.cfg.WSTimeout
	}
	// The owner recorded dispatched before this call: the nonce left received.
	d.forgetBusReceived(f.Nonce)
	h := HandOver{Frame: frame, Unsigned: f.Signature == "", TimeoutMs: timeout.Milliseconds(),
		Bus: &BusMark{MessageID: del.MessageID, Attempt: del.Attempt, Auth: del.Auth}, Admitted: d.clock()}
	if f.Intent == pipelineHopIntent && del.Author != "" {
		h.Bus, h.Admitted = nil, time.Time{}
		h.Hop = &HopMark{Author: del.Author, Auth: del.Auth, SenderKey: del.SenderKey, MessageID: del.MessageID, Attempt: del.Attempt}
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout+2*time.Second)
		defer cancel()
		rep, err := r.Hand(ctx, node, h)
		var o Outcome
		switch {
		case err != nil:
			o.ErrorCode, o.Error = handFailure(node, f.To, err)
		case h.Hop != nil && rep.Error != nil && rep.Error.Code == CodeOffline:
			// The actor left that node before the hop reached it: no
			// attempt was made.
			o.Err = fmt.Errorf("%w: node %s: %s", ErrRecipientOffline, node, rep.Error.Message)
		case h.Hop != nil && rep.Error != nil && rep.Error.Code == CodeInProgress:
			// That node still delivers an earlier attempt of the same hop
			// (one a node taken over had handed to it): not an attempt,
			// the hop waits and is handed again.
			o.Err = fmt.Errorf("%w: node %s: %s", ErrNonceBusy, node, rep.Error.Message)
		case rep.Error != nil:
			o.ErrorCode, o.Error = rep.Error.Code, fmt.Sprintf("node %s: %s", node, rep.Error.Message)
		case rep.Recorded:
			o.Recorded = &DeliveryRecord{Node: node, Result: rep.Result}
		default:
			rf, derr := wire.DecodeResultFrame(rep.Result)
			if derr != nil {
				o.ErrorCode, o.Error = CodeDeliveryFailed, fmt.Sprintf("node %s answered an unreadable result: %v", node, derr)
			} else {
				o.Result, o.Written = rf, true
			}
		}
		a.finish(o)
	}()
	return true
}

// routeNode hands inf to the node that holds the recipient's session. It
// reports false when no other node does (or inf came from one).
func (d *Directory) routeNode(inf *inflight, f *wire.IntentFrame, pre []tracing.Event, extra map[string]any) bool {
	r := d.nodeRouter()
	if r == nil || inf.origin == originCluster || inf.owned != nil {
		return false
	}
	node, ok := r.NodeFor(inf.to)
	if !ok {
		return false
	}
	frame, err := frameBytes(f)
	if err != nil {
		d.fail(inf, pre, CodeInvalidIntent, fmt.Sprintf("frame cannot be handed over: %v", err), false, extra)
		return true
	}
	extra = withExtra(extra, "node", node)
	ev := inf.event(tracing.Dispatched, TransportCluster)
	ev.Details = tracing.Details{TimeoutMs: inf.timeout.Milliseconds(), Extra: extra}
	if err := d.append(append(pre, ev)...); err != nil {
		d.abort(inf, err)
		return true
	}
	d.mu.Lock()
	inf.transport = TransportCluster
	inf.waiting = true
	inf.timer = time.AfterFunc(inf.timeout, func() { d.expire(inf) })
	d.mu.Unlock()
	h := HandOver{Frame: frame, JWS: inf.jws, Unsigned: f.Signature == "" && inf.jws == "",
		VouchedBy: inf.vouchedBy, TimeoutMs: inf.timeout.Milliseconds()}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), inf.timeout)
		defer cancel()
		rep, err := r.Hand(ctx, node, h)
		if err != nil {
			if d.settle(inf) {
				code, msg := handFailure(node, inf.to, err)
				d.fail(inf, nil, code, msg, true, extra)
			}
			return
		}
		if !d.settle(inf) {
			return
		}
		if rep.Error != nil {
			d.fail(inf, nil, rep.Error.Code, rep.Error.Message, RetryableCode(rep.Error.Code), extra)
			return
		}
		rf, err := wire.DecodeResultFrame(rep.Result)
		if err != nil {
			d.fail(inf, nil, CodeInvalidIntent, fmt.Sprintf("node %s answered an unreadable result: %v", node, err), false, extra)
			return
		}
		d.finishWithResult(inf, rf, extra)
	}()
	return true
}

// claimClusterNonce refuses a frame whose nonce another node of the cluster
// accepted (replay protection across nodes). A frame handed over by another
// node was claimed there. Frames from peer directories claim it too: the
// nodes take federation messages in one queue group, so a peer's retry may
// reach another node than its first attempt. That node answers IN_PROGRESS,
// which the peer's relay retries until the queue group gives the frame to
// the node holding the claim, whose replay check answers it (cached result
// or IN_PROGRESS).
func (d *Directory) claimClusterNonce(ctx context.Context, f *wire.IntentFrame, o RelayOptions) *RelayError {
	r := d.nodeRouter()
	if r == nil || o.Origin == originCluster {
		return nil
	}
	ok, err := r.ClaimNonce(ctx, f.From, f.Nonce)
	if err != nil {
		return relayErr(CodeRelayError, f.Nonce, "the cluster cannot check the nonce now; retry: %v", err)
	}
	switch {
	case ok:
		return nil
	case o.Origin == OriginFederation:
		return relayErr(CodeInProgress, f.Nonce, "Nonce %s is handled by another node of this directory; retry", f.Nonce)
	}
	return relayErr(CodeNonceReuse, f.Nonce, "Nonce %s was used on another node of this directory", f.Nonce)
}

// frameBytes is the frame as it arrived, or its delivery JSON when it was
// built here.
func frameBytes(f *wire.IntentFrame) ([]byte, error) {
	if len(f.Raw) > 0 {
		return f.Raw, nil
	}
	return f.DeliveryJSON()
}

// handFailure is the retryable failure of a hand-over node did not answer.
func handFailure(node, to string, err error) (code, msg string) {
	code = CodeDeliveryFailed
	if errors.Is(err, context.DeadlineExceeded) {
		code = CodeTimeout
	}
	return code, fmt.Sprintf("node %s holding the session of %s did not answer: %v", node, to, err)
}

// claimClusterBusNonce refuses a bus message whose nonce another node of
// the cluster accepted (as an intent or a message).
func (d *Directory) claimClusterBusNonce(from, nonce string) *RelayError {
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	return d.claimClusterNonce(ctx, &wire.IntentFrame{From: from, Nonce: nonce}, RelayOptions{Origin: transportBus})
}
