package directory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// Origins of a frame: how it reached the directory. The origin is the
// transport of the received event and decides the default result timeout.
const (
	originHTTP = "http"
	originWS   = "ws"
)

// Transports of dispatched events.
const (
	TransportWS         = "ws"
	TransportDirectHTTP = "direct-http"
	transportEcho       = "builtin-echo"
)

// appendTimeout bounds one log write made on behalf of an intent. Log
// writes never use the caller's context: an append that was handed to the
// writer must not be abandoned halfway because a client went away.
const appendTimeout = 30 * time.Second

// RelayOptions say how a frame reached the relay and what the caller has
// already established about it.
type RelayOptions struct {
	// Origin is originHTTP or originWS (default originHTTP).
	Origin string
	// SessionBeamID is the authenticated agent of the WebSocket session the
	// frame arrived on; the frame's from must equal it. Empty for HTTP: from
	// must then be a registered local agent.
	SessionBeamID string
	// allowUnsigned accepts a frame without a signature because the
	// sender was authenticated otherwise: a session opened with the agent's
	// API key (ws.go), or a peer directory that vouches for the frame
	// (VouchedByPeer). A signature that is present is still verified. It is
	// unexported so that no importer can turn verification off by setting a
	// field.
	allowUnsigned bool
	// vouchedBy names the peer directory that vouches for an unsigned
	// frame; its delivery is attested with auth "peer".
	vouchedBy string
	// Timeout overrides the result timeout (default WSTimeout for
	// originWS, HTTPTimeout otherwise).
	Timeout time.Duration
	// Sender, when set, is the sending agent as the caller resolved it (a
	// peer directory's agent, whose key its home directory vouched for); the
	// registry is not consulted. The frame's from must equal Sender.BeamID.
	Sender *registry.Agent
	// Extra is added to the details of the received event (federation:
	// peer, hop, origin).
	Extra map[string]any
	// AdmittedAt, when set, is when the sender's home directory admitted
	// the frame (a durable send forwarded by a peer that vouches for the
	// instant): the replay window is checked against it instead of now, so
	// a frame that waited out a long outage is still accepted. The nonce
	// rules still apply, so it cannot be delivered twice.
	AdmittedAt time.Time
	// JWS is the beam/2 compact JWS the frame arrived in (its payload is
	// the frame's bytes). The frame then needs no beam/1 signature: the JWS
	// is verified against the sender's key instead, recorded with the
	// intent, and delivered verbatim.
	JWS string

	resultJWS *jwsSink // receives the recipient's result JWS (beam2.go)
	busMark   *BusMark // a bus attempt another node handed over (cluster.go)
}

// VouchedByPeer returns o for a frame without a signature that the peer
// directory peer forwarded and vouches for with its own signature on the
// federation message: Relay accepts the frame unsigned and attests its
// delivery with auth "peer". Only the federation inbound path, which has
// verified the peer's message, may use it. A frame that carries a
// signature still has it verified.
func (o RelayOptions) VouchedByPeer(peer string) RelayOptions {
	if peer == "" {
		return o
	}
	o.allowUnsigned, o.vouchedBy = true, peer
	return o
}

// inflight is what this process is doing with one nonce: it is the nonce's
// claim (no second frame with the nonce may start while it exists) and,
// once dispatched over WebSocket, the waiter for its result.
type inflight struct {
	nonce, from, to, intentType string
	hash                        string // payload hash; "" for placeholders
	origin                      string
	attempt                     int
	timeout                     time.Duration
	peer                        string    // the peer directory of a forwarded intent
	start                       time.Time // d.clock() at receipt
	t0                          time.Time // time.Now() at receipt (metrics)
	done                        func([]byte, *RelayError)
	// fresh is set when the nonce was recorded optimistically as new: the
	// frame and sender to replay if the log already had the nonce.
	fresh *freshFrame

	// Guarded by Directory.mu.
	transport   string
	waiting     bool     // a result from the recipient may settle it
	recipient   *session // the session the frame was handed to
	timer       *time.Timer
	finished    bool // settled: no further delivered event
	delivering  bool // being written, queued for or being recorded by the delivered recorder
	delivered   bool // delivered is committed
	delivQueued bool // written; delivered waits in the recorder's queue
	// needDelivered: settle took delivered out of the recorder's queue (or
	// queueDelivered handed it to a settle waiting for the write); the
	// settling caller records it before its own events.
	needDelivered bool
	deliveredCh   chan struct{} // closed when delivering ends
	released      chan struct{} // closed when the claim is released
	owned         *ownedAttempt // set for an owner's Delivery (door.go)
	jws           string        // beam/2: the sender's intent JWS (beam2.go)
	vouchedBy     string        // the peer vouching for an unsigned frame (attested.go)
	resultJWS     *jwsSink      // beam/2: where the recipient's result JWS goes
	busMark       *BusMark      // the "bus" member of a handed-over bus attempt (cluster.go)
}

// event returns an event of inf's nonce with the intent's identity set.
func (inf *inflight) event(state tracing.State, transport string) tracing.Event {
	return tracing.Event{
		Nonce:      inf.nonce,
		State:      state,
		From:       inf.from,
		To:         inf.to,
		IntentType: inf.intentType,
		Transport:  transport,
		Attempt:    inf.attempt,
	}
}

func (inf *inflight) latencyMs(now time.Time) *int64 {
	ms := now.Sub(inf.start).Milliseconds()
	if ms < 0 {
		ms = 0
	}
	return &ms
}

// Relay validates f, applies the nonce rules, routes it and waits for the
// outcome: the result frame to return to the sender (a recipient's result,
// the echo result or a cached result), or a RelayError. It returns early
// with a RELAY_ERROR when ctx ends; the intent itself goes on and is
// recorded as usual.
func (d *Directory) Relay(ctx context.Context, f *wire.IntentFrame, opts RelayOptions) ([]byte, *RelayError) {
	type outcome struct {
		res []byte
		err *RelayError
	}
	ch := make(chan outcome, 1)
	d.submit(ctx, f, opts, func(res []byte, err *RelayError) { ch <- outcome{res, err} })
	select {
	case o := <-ch:
		return o.res, o.err
	case <-ctx.Done():
		return nil, relayErr(CodeRelayError, f.Nonce, "stopped waiting for the result: %v", ctx.Err())
	}
}

// submit runs the pipeline for f and calls done exactly once with the
// outcome, possibly from another goroutine (a result, a timer).
func (d *Directory) submit(ctx context.Context, f *wire.IntentFrame, o RelayOptions, done func([]byte, *RelayError)) {
	if o.Origin == "" {
		o.Origin = originHTTP
	}
	t0 := time.Now()
	var once sync.Once
	finish := func(res []byte, err *RelayError) {
		once.Do(func() {
			d.m.latency.Observe(time.Since(t0).Seconds())
			done(res, err)
		})
	}
	sender, rerr := d.checkSender(f, o)
	if rerr == nil {
		rerr = d.checkSignature(f, sender, o)
	}
	if rerr == nil && d.cfg.AllowSender != nil && o.Origin != OriginFederation {
		if ok, wait := d.cfg.AllowSender(sender.BeamID); !ok {
			rerr = relayErr(codeRateLimited, f.Nonce, "Too many intents from %s; retry later", sender.BeamID)
			rerr.RetryAfter = wait
		}
	}
	if rerr == nil {
		rerr = d.claimClusterNonce(ctx, f, o)
	}
	if rerr != nil {
		d.rejectFrame(rerr, f.From, o.Origin)
		finish(nil, rerr)
		return
	}
	d.reg.Touch(sender.BeamID)
	hash, err := framePayloadHash(f)
	if err != nil {
		rerr := relayErr(CodeInvalidIntent, f.Nonce, "payload is not valid JSON: %v", err)
		d.rejectFrame(rerr, f.From, o.Origin)
		finish(nil, rerr)
		return
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = d.cfg.HTTPTimeout
		if o.Origin == originWS {
			timeout = d.cfg.WSTimeout
		}
	}
	inf := &inflight{
		nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, hash: hash,
		origin: o.Origin, attempt: 1, timeout: timeout,
		start: d.clock(), t0: t0, done: finish, jws: o.JWS, resultJWS: o.resultJWS, vouchedBy: o.vouchedBy,
		busMark: o.busMark,
	}
	lookup, rerr := d.claimNew(inf)
	if rerr != nil {
		d.m.relayed.WithLabelValues(outcomeRefused).Inc()
		finish(nil, rerr)
		return
	}
	if lookup {
		// The bus may hold this nonce in received, where an optimistic
		// received would pass as an annotation: look it up first.
		row, exists, err := d.log.Intent(ctx, f.Nonce)
		if err != nil {
			d.abort(inf, fmt.Errorf("look up nonce: %w", err))
			return
		}
		if exists {
			d.replay(ctx, inf, f, sender, row)
			return
		}
	}
	// The nonce is recorded optimistically: a nonce the log already has
	// rejects the first append (abort then takes the replay path).
	inf.fresh = &freshFrame{frame: f, sender: sender}
	received := inf.event(tracing.Received, o.Origin)
	frame := f.Raw
	if len(frame) == 0 {
		if frame, err = f.DeliveryJSON(); err != nil {
			d.abort(inf, fmt.Errorf("encode frame: %w", err))
			return
		}
	}
	received.Details = tracing.Details{
		Owner:           tracing.OwnerDirectory,
		Frame:           frame,
		ClientTimestamp: f.Timestamp,
		TimeoutMs:       timeout.Milliseconds(),
		Extra:           map[string]any{"payloadHash": hash},
	}
	for k, v := range o.Extra {
		received.Details.Extra[k] = v
	}
	beam2Details(o, received.Details.Extra)
	at := inf.start
	if !o.AdmittedAt.IsZero() {
		at = o.AdmittedAt
		received.Details.Extra["admittedAt"] = o.AdmittedAt.UTC().Format(time.RFC3339Nano)
	}
	code, msg := d.checkAdmission(f, at)
	if code == "" {
		code, msg = d.checkEndToEnd(f, o.JWS, o.vouchedBy)
	}
	if code != "" {
		d.fail(inf, []tracing.Event{received}, code, msg, false, nil)
		return
	}
	// Room for the path's first event (dispatched), which is appended to
	// these two in the same call.
	pre := make([]tracing.Event, 2, 3)
	pre[0], pre[1] = received, inf.event(tracing.Validated, "")
	d.route(inf, f, sender, pre)
}

// checkSender resolves the sending agent (§2.5 step 2).
func (d *Directory) checkSender(f *wire.IntentFrame, o RelayOptions) (registry.Agent, *RelayError) {
	if o.SessionBeamID != "" {
		if f.From != o.SessionBeamID {
			return registry.Agent{}, relayErr(CodeForbidden, f.Nonce,
				"Session of %s may not send intents from %s", o.SessionBeamID, f.From)
		}
	}
	if o.Sender != nil {
		if f.From != o.Sender.BeamID {
			return registry.Agent{}, relayErr(CodeForbidden, f.Nonce, "Frame from %s does not match the vouched sender %s", f.From, o.Sender.BeamID)
		}
		return *o.Sender, nil
	}
	a, ok := d.reg.Get(f.From)
	if !ok {
		return registry.Agent{}, relayErr(CodeInvalidIntent, f.Nonce, "Sender %s is not registered", f.From)
	}
	if !d.reg.Serves(a.BeamID) {
		// Registered before its domain became a pinned peer's: the peer's
		// agents are the only senders in that domain.
		return registry.Agent{}, relayErr(CodeForbidden, f.Nonce, "Sender %s is in a domain this directory does not serve", f.From)
	}
	return a, nil
}

// checkSignature verifies the frame's signature once, here at the edge.
func (d *Directory) checkSignature(f *wire.IntentFrame, sender registry.Agent, o RelayOptions) *RelayError {
	if o.JWS != "" {
		return d.checkJWS(f, sender, o)
	}
	if f.Signature == "" {
		if o.allowUnsigned {
			return nil
		}
		return relayErr(CodeInvalidIntent, f.Nonce, "Signature required")
	}
	if err := f.Verify(sender.PublicKey); err != nil {
		return relayErr(CodeInvalidIntent, f.Nonce, "%s", BadSignatureMessage(f, sender))
	}
	return nil
}

// maxRevokedKeysChecked bounds the former keys BadSignatureMessage tries,
// newest first, so a bad frame costs a few verifications at most.
const maxRevokedKeysChecked = 4

// BadSignatureMessage is the error text for frame f whose signature does
// not verify with sender's current key. It says whether f is signed with
// one of the sender's revoked keys (the usual cause: an identity file
// kept after the key was rotated), and what to do either way.
func BadSignatureMessage(f *wire.IntentFrame, sender registry.Agent) string {
	checked := 0
	for i := len(sender.Keys) - 1; i >= 0 && checked < maxRevokedKeysChecked; i-- {
		k := sender.Keys[i]
		if !k.Revoked() {
			continue
		}
		checked++
		if pub, err := wire.ParsePublicKey(k.PublicKey); err == nil && f.Verify(pub) == nil {
			return fmt.Sprintf("Signature verification failed: the frame is signed with a revoked key of %s (rotated out or revoked); "+
				"sign with its current key: use the identity file that holds it", sender.BeamID)
		}
	}
	return fmt.Sprintf("Signature verification failed: the signature does not verify with %s's current key "+
		"(if the key in this identity file was rotated or revoked, use the identity file with the current key)", sender.BeamID)
}

// checkAdmission applies policy, the replay window and the delivered-size
// limit to an authentic frame. It returns "" when the frame may proceed.
func (d *Directory) checkAdmission(f *wire.IntentFrame, now time.Time) (code, msg string) {
	if code, msg := d.checkPolicy(f.From, f.To, f.Intent); code != "" {
		return code, msg
	}
	if code, msg := d.checkPipelineRouteAuthor(f); code != "" {
		return code, msg
	}
	if code, msg := d.checkCatalog(f); code != "" {
		return code, msg
	}
	ts, err := wire.ParseTimestamp(f.Timestamp)
	if err != nil {
		return codeBadRequest, "Invalid timestamp format"
	}
	if diff := now.Sub(ts); diff > ReplayWindow || diff < -ReplayWindow {
		return codeBadRequest, "Timestamp outside allowed replay window (5 minutes)"
	}
	size, err := f.SignedDeliverySize()
	if err != nil {
		return CodeInvalidIntent, fmt.Sprintf("frame cannot be delivered: %v", err)
	}
	if size > d.cfg.MaxFrameBytes {
		return codeFrameTooLarge, fmt.Sprintf("delivered frame would be %d bytes; recipients accept at most %d", size, d.cfg.MaxFrameBytes)
	}
	return "", ""
}

// checkPolicy applies a local recipient's policy to an intent from from:
// its ACL rules (deny first), the default policy and org membership. It
// returns "" when the intent may proceed.
func (d *Directory) checkPolicy(from, to, intent string) (code, msg string) {
	if _, local := d.reg.Get(to); !local {
		return "", ""
	}
	if ok, reason := d.reg.Allowed(from, to, intent); !ok {
		msg := fmt.Sprintf("ACL denied intent %s from %s to %s", intent, from, to)
		if reason != "" {
			msg += " (" + reason + ")"
		}
		return CodeForbidden, msg
	}
	return "", ""
}

// rejectFrame logs and counts a frame refused before anything was recorded.
func (d *Directory) rejectFrame(rerr *RelayError, from, origin string) {
	d.m.rejected.WithLabelValues(rerr.Code).Inc()
	d.m.relayed.WithLabelValues(outcomeRefused).Inc()
	d.lg.Info("frame rejected", "code", rerr.Code, "reason", rerr.Message, "nonce", rerr.Nonce, "from", from, "origin", origin)
}

// framePayloadHash is payloadHash of f's payload, normalised from the
// parse tree the frame decoder built (no second parse).
func framePayloadHash(f *wire.IntentFrame) (string, error) {
	js, err := f.PayloadJS()
	if err != nil {
		return payloadHash(f.Payload) // not an object: as payloadHash decides
	}
	sum := sha256.Sum256(js)
	return hex.EncodeToString(sum[:]), nil
}

// payloadHash is the hex SHA-256 of the JavaScript-normalised payload.
func payloadHash(payload []byte) (string, error) {
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	js, err := wire.JSStringify(payload)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(js)
	return hex.EncodeToString(sum[:]), nil
}

// claim makes inf the nonce's claim, or says why the nonce is busy.
func (d *Directory) claim(inf *inflight) *RelayError {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.claimLocked(inf)
}

// claimLocked is claim with d.mu held.
func (d *Directory) claimLocked(inf *inflight) *RelayError {
	if d.closed {
		return relayErr(CodeRelayError, inf.nonce, "directory is shutting down")
	}
	if other, ok := d.claims[inf.nonce]; ok {
		if other.from != inf.from || other.to != inf.to || other.intentType != inf.intentType ||
			(other.hash != "" && inf.hash != "" && other.hash != inf.hash) {
			return relayErr(CodeNonceReuse, inf.nonce, "Nonce %s was already used for a different intent", inf.nonce)
		}
		return relayErr(CodeInProgress, inf.nonce, "Intent %s is already in progress", inf.nonce)
	}
	inf.released = make(chan struct{})
	d.claims[inf.nonce] = inf
	return nil
}

// claimNew is claim for a frame about to be recorded; lookup says that the
// nonce may be one the bus holds in received, so the log must be asked
// before recording it optimistically.
func (d *Directory) claimNew(inf *inflight) (lookup bool, rerr *RelayError) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rerr := d.claimLocked(inf); rerr != nil {
		return false, rerr
	}
	_, lookup = d.busRecv[inf.nonce]
	return lookup, nil
}

// release drops inf's claim.
func (d *Directory) release(inf *inflight) {
	d.mu.Lock()
	if d.claims[inf.nonce] == inf {
		delete(d.claims, inf.nonce)
		if inf.released != nil {
			close(inf.released)
		}
	}
	d.mu.Unlock()
}

// append writes events in one atomic, durable call.
func (d *Directory) append(events ...tracing.Event) error {
	if len(events) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	if _, err := d.log.Append(ctx, events...); err != nil {
		return fmt.Errorf("record %s of %s: %w", events[len(events)-1].State, events[0].Nonce, err)
	}
	return nil
}

// freshFrame is what the replay path needs of a frame whose nonce was
// recorded optimistically as new.
type freshFrame struct {
	frame  *wire.IntentFrame
	sender registry.Agent
}

// nonceTaken reports whether err is the log's refusal of an optimistic
// received event because the nonce already has events.
func nonceTaken(err error) bool {
	var te *tracing.TransitionError
	return errors.As(err, &te) && te.To == tracing.Received && te.From != ""
}

// replayTaken takes the replay path for inf, whose optimistic first append
// was refused because the log already has the nonce. Nothing was recorded.
func (d *Directory) replayTaken(inf *inflight) {
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	// A new inflight takes over the claim: inf may carry a settled waiter.
	nf := &inflight{
		nonce: inf.nonce, from: inf.from, to: inf.to, intentType: inf.intentType, hash: inf.hash,
		origin: inf.origin, attempt: 1, timeout: inf.timeout, start: inf.start, t0: inf.t0,
		done: inf.done, jws: inf.jws, resultJWS: inf.resultJWS, vouchedBy: inf.vouchedBy,
	}
	d.mu.Lock()
	if d.claims[inf.nonce] == inf {
		nf.released = inf.released
		d.claims[inf.nonce] = nf
	}
	d.mu.Unlock()
	if nf.released == nil {
		d.abort(inf, fmt.Errorf("nonce %s: claim lost", inf.nonce))
		return
	}
	row, exists, err := d.log.Intent(ctx, nf.nonce)
	if err == nil && !exists {
		err = fmt.Errorf("nonce %s: refused as taken but not found", nf.nonce)
	}
	if err != nil {
		d.abort(nf, fmt.Errorf("look up nonce: %w", err))
		return
	}
	d.replay(ctx, nf, inf.fresh.frame, inf.fresh.sender, row)
}

// abort answers RELAY_ERROR after a log failure; nothing more is recorded.
// A first append refused because the nonce already exists is not a failure:
// the frame is a replay and takes the replay path.
func (d *Directory) abort(inf *inflight, err error) {
	if inf.fresh != nil && nonceTaken(err) {
		d.replayTaken(inf)
		return
	}
	d.lg.Error("relay aborted", "nonce", inf.nonce, "err", err)
	d.release(inf)
	d.m.relayed.WithLabelValues(outcomeFailed).Inc()
	code := CodeRelayError
	var te *tracing.TransitionError
	if errors.As(err, &te) {
		// Someone else (the bus, an operator) moved the nonce meanwhile.
		code = CodeInProgress
	}
	// The log's error is for the operator's log only: it names tables,
	// states and sequence numbers, never something the sender can act on.
	inf.done(nil, relayErr(code, inf.nonce, "intent could not be recorded"))
}

// fail records pre followed by a failed event with a synthesized failure
// result, releases the claim and answers the sender.
func (d *Directory) fail(inf *inflight, pre []tracing.Event, code, msg string, retryable bool, extra map[string]any) {
	if inf.owned != nil {
		d.ownedFailed(inf, code, msg)
		return
	}
	now := d.clock()
	lat := inf.latencyMs(now)
	result := wire.FailureResult(inf.nonce, code, msg, now, lat)
	ev := inf.event(tracing.Failed, "")
	ev.Details = tracing.Details{ErrorCode: code, Error: msg, Retryable: retryable, LatencyMs: lat, Result: result, Extra: extra}
	if inf.needDelivered {
		pre = append(pre, inf.event(tracing.Delivered, TransportWS))
	}
	if err := d.append(append(pre, ev)...); err != nil {
		d.abort(inf, err)
		return
	}
	d.release(inf)
	d.m.relayed.WithLabelValues(outcomeFailed).Inc()
	inf.done(nil, &RelayError{Code: code, Message: msg, Nonce: inf.nonce, Result: result})
}

// route picks the path of a validated intent (§5.5) and records pre with
// the path's first events.
func (d *Directory) route(inf *inflight, f *wire.IntentFrame, sender registry.Agent, pre []tracing.Event) {
	agent, registered := d.reg.Get(f.To)
	if registered && !d.reg.Serves(f.To) {
		// A local agent left in a pinned peer's domain never shadows the
		// peer's agent.
		registered = false
	}
	if f.To == registry.EchoBeamID && (!registered || (agent.HTTPEndpoint == "" && !d.Online(f.To))) {
		d.echo(inf, f, pre)
		return
	}
	if !registered && d.routeRemote(inf, f, pre) {
		return
	}
	if !registered {
		why := "federation does not forward through intermediate directories"
		if !d.reg.Serves(f.To) {
			// Another directory's domain: only pinning it reaches the agent.
			why += ": pin its directory as a peer"
		}
		d.fail(inf, pre, codeUnknownAgent, fmt.Sprintf("Agent %s is not registered here and no pinned peer serves its domain (%s)", f.To, why), true, nil)
		return
	}
	if agent.HTTPEndpoint != "" {
		go d.directHTTP(inf, f, sender, agent.HTTPEndpoint, pre)
		return
	}
	d.deliverWS(inf, f, sender, pre, nil)
}

// deliverWS records dispatched, then hands the frame to the recipient's
// session; the waiter is settled by the result, the timer or a failure.
func (d *Directory) deliverWS(inf *inflight, f *wire.IntentFrame, sender registry.Agent, pre []tracing.Event, extra map[string]any) {
	s := d.session(inf.to)
	if s == nil && d.routeNode(inf, f, pre, extra) {
		return
	}
	if s == nil {
		d.fail(inf, pre, CodeOffline, fmt.Sprintf("Agent %s is offline", inf.to), true, extra)
		return
	}
	if inf.jws != "" && !s.beam2 {
		d.fail(inf, pre, codeUnsupportedProtocol, unsupportedProtocol(inf.to), false, extra)
		return
	}
	h, err := d.handOver(f, sender.PublicKeyB64, inf.jws, inf.attestAuth(), inf.vouchedBy)
	var msg []byte
	if err == nil {
		msg, err = h.message()
	}
	if err == nil && inf.busMark != nil {
		msg, err = withBusMember(msg, *inf.busMark)
	}
	msg = withJWSMember(msg, inf.jws)
	if err != nil {
		d.fail(inf, pre, CodeInvalidIntent, fmt.Sprintf("frame cannot be delivered: %v", err), false, extra)
		return
	}
	ev := inf.event(tracing.Dispatched, TransportWS)
	ev.Details = tracing.Details{TimeoutMs: inf.timeout.Milliseconds(), Extra: h.details(extra)}
	if err := d.append(append(pre, ev)...); err != nil {
		d.abort(inf, err)
		return
	}
	d.mu.Lock()
	inf.transport = TransportWS
	inf.waiting = true
	inf.recipient = s
	inf.timer = time.AfterFunc(inf.timeout, func() { d.expire(inf) })
	d.mu.Unlock()
	if !s.enqueue(outMsg{data: msg, inf: inf}) {
		d.undelivered(inf, fmt.Sprintf("session of %s closed before delivery", inf.to))
	}
}

// handDelivered gives the recording of inf's delivered to the caller that
// settles it: that caller appends it before (with) its own events. The
// caller holds d.mu.
func (inf *inflight) handDelivered() {
	inf.delivering = false
	inf.needDelivered = true
	close(inf.deliveredCh)
}

// settle ends inf's wait. It returns false when inf was settled already.
// When inf's frame is being written, settle waits for the write; when
// delivered is being recorded, for that commit. So the caller's events
// always follow delivered, or carry it (needDelivered, or, for a result,
// isDelivered false).
func (d *Directory) settle(inf *inflight) bool {
	d.mu.Lock()
	if inf.finished {
		d.mu.Unlock()
		return false
	}
	inf.finished = true
	inf.waiting = false
	if inf.timer != nil {
		inf.timer.Stop()
	}
	var wait chan struct{}
	if inf.delivering {
		if inf.delivQueued {
			// delivered is not issued yet: the caller (or, for an
			// owner's delivery, the owner) records it with its own events, in the
			// same append.
			inf.delivQueued = false
			inf.handDelivered()
		} else {
			// Being written: wait for the write, after which
			// queueDelivered hands delivered to the caller as above.
			// Being recorded: wait for that commit.
			wait = inf.deliveredCh
		}
	}
	d.mu.Unlock()
	if wait != nil {
		<-wait
	}
	return true
}

func (d *Directory) isDelivered(inf *inflight) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return inf.delivered
}

// expire fails inf with TIMEOUT when no result came in time.
func (d *Directory) expire(inf *inflight) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed || !d.settle(inf) {
		return
	}
	msg := fmt.Sprintf("No result from %s within %s", inf.to, inf.timeout)
	if peer := inf.peer; peer != "" && d.peerLinkDown(peer) {
		msg += fmt.Sprintf(": its directory %s is unreachable from this one (no connection to it). "+
			"Check that it is running (beam peer list on this directory shows the link), then send again, "+
			"or send with --durable to have it delivered when %s is back", peer, peer)
	}
	d.fail(inf, nil, CodeTimeout, msg, true, nil)
}

// undelivered fails inf whose frame never reached the recipient.
func (d *Directory) undelivered(inf *inflight, msg string) {
	if !d.settle(inf) {
		return
	}
	d.fail(inf, nil, CodeDeliveryFailed, msg, true, nil)
}

// finishWithResult records the recipient's result for a settled inf and
// answers the sender with the result frame.
func (d *Directory) finishWithResult(inf *inflight, rf *wire.ResultFrame, extra map[string]any) {
	if inf.owned != nil {
		d.ownedResult(inf, rf)
		return
	}
	now := d.clock()
	lat := inf.latencyMs(now)
	var events []tracing.Event
	transport := inf.transport
	if !d.isDelivered(inf) {
		events = append(events, inf.event(tracing.Delivered, transport))
	}
	outcome := outcomeAcked
	switch {
	case wire.IsAsyncAcceptance(rf):
		ev := inf.event(tracing.Delivered, transport)
		ev.Details = tracing.Details{LatencyMs: lat, Result: rf.Raw, Extra: withExtra(extra, "asyncAccepted", true)}
		events = append(events, ev)
		outcome = outcomeAccepted
	case rf.Success:
		ev := inf.event(tracing.Acked, transport)
		ev.Details = tracing.Details{LatencyMs: lat, Result: rf.Raw, Extra: extra}
		events = append(events, ev)
	default:
		code := rf.ErrorCode
		if code == "" {
			code = CodeResultError
		}
		ev := inf.event(tracing.Failed, transport)
		ev.Details = tracing.Details{ErrorCode: code, Error: rf.Error, Retryable: RetryableCode(code), LatencyMs: lat,
			Result: rf.Raw, Extra: withExtra(extra, "recipientResult", true)}
		events = append(events, ev)
		outcome = outcomeFailed
	}
	if err := d.append(events...); err != nil {
		d.abort(inf, err)
		return
	}
	d.release(inf)
	d.m.relayed.WithLabelValues(outcome).Inc()
	inf.done(rf.Raw, nil)
}

func withExtra(extra map[string]any, key string, v any) map[string]any {
	out := make(map[string]any, len(extra)+1)
	for k, x := range extra {
		out[k] = x
	}
	out[key] = v
	return out
}

// beginDelivery marks inf as being written; false when it was settled
// already and must not be written at all.
func (d *Directory) beginDelivery(inf *inflight) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if inf.finished {
		return false
	}
	inf.delivering = true
	inf.deliveredCh = make(chan struct{})
	return true
}

// abandonDelivery undoes beginDelivery for frames that were not written.
func (d *Directory) abandonDelivery(infs []*inflight) {
	d.mu.Lock()
	for _, inf := range infs {
		inf.delivering = false
		close(inf.deliveredCh)
	}
	d.mu.Unlock()
}
