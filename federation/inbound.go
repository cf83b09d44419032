package federation

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// onMessage takes a message on this directory's subjects. Verification and
// handling run off the subscription goroutine, at most MaxInbound at once.
func (n *Node) onMessage(msg *nats.Msg) {
	select {
	case n.inbound <- struct{}{}:
	default:
		n.m.rejected.WithLabelValues("busy").Inc()
		n.lg.Warn("inbound federation message dropped: too many in flight", "subject", msg.Subject)
		return
	}
	go func() {
		defer func() { <-n.inbound }()
		n.handle(msg)
	}()
}

// rejected counts and logs a refused message.
func (n *Node) rejected(err error, peer string) {
	reason := rejectMalformed
	var re *rejectError
	if errors.As(err, &re) {
		reason = re.Reason
	}
	n.m.rejected.WithLabelValues(reason).Inc()
	n.lg.Warn("federation message rejected", "reason", reason, "peer", peer, "err", err)
}

func (n *Node) handle(msg *nats.Msg) {
	target, originTok, kind, err := parseSubject(msg.Subject)
	if err != nil || target != Token(n.cfg.Domain) {
		n.rejected(rejectf(rejectMisaddressed, "subject %q", truncate(msg.Subject)), "")
		return
	}
	n.mu.Lock()
	peer, ok := n.byToken[originTok]
	n.mu.Unlock()
	if !ok {
		n.rejected(rejectf(rejectUnpinned, "no pinned peer for subject token %q", truncate(originTok)), originTok)
		return
	}
	// The answer is published with this directory's rights, so it may go
	// only to the peer's own inbox: a reply subject of the peer's choosing
	// would write into this server's JetStream ($JS, $KV) or the
	// cluster's subjects in this directory's name.
	if msg.Reply != "" && !strings.HasPrefix(msg.Reply, InboxPrefix(peer)+".") {
		n.rejected(rejectf(rejectReply, "reply subject %q is not in the peer's inbox %s", truncate(msg.Reply), InboxPrefix(peer)), peer)
		return
	}
	now := n.clock()
	m, err := open(msg.Data, n.cfg.Domain, peer, kind, n.pinnedKey, now)
	if err != nil {
		n.rejected(err, peer)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), maxIntentTimeout+time.Minute)
	defer cancel()
	if err := n.store.markSeen(ctx, m.ID, peer, time.UnixMilli(m.Expires), now); err != nil {
		if errors.Is(err, errReplay) {
			n.rejected(rejectf(rejectReplay, "message %s was already received", m.ID), peer)
			return
		}
		n.lg.Error("record federation message id", "err", err)
		return
	}
	n.contact(peer)
	n.m.received.WithLabelValues(peer, kind).Inc()
	var reply *Message
	switch kind {
	case kindIntent:
		reply = n.handleIntent(ctx, peer, m)
	case KindResolve:
		reply = n.handleResolve(peer, m)
	default:
		n.rejected(rejectf(rejectMisaddressed, "kind %q is not a request", truncate(kind)), peer)
		return
	}
	if msg.Reply == "" {
		return
	}
	now = n.clock()
	reply.Kind, reply.ID, reply.From, reply.To, reply.Re = kindResult, newID(), n.cfg.Domain, peer, m.ID
	reply.IssuedAt, reply.Expires = now.UnixMilli(), now.Add(time.Minute).UnixMilli()
	tok, err := seal(reply, n.cfg.Key)
	if err != nil {
		n.lg.Error("seal reply", "err", err)
		return
	}
	if err := msg.Respond(tok); err != nil {
		n.lg.Warn("reply to peer", "peer", peer, "err", err)
	}
}

func errorReply(code, msg string) *Message {
	return &Message{Status: statusError, ErrorCode: code, Error: msg}
}

// handleIntent runs a forwarded intent through this directory's relay (its
// own policies, nonce rules and lifecycle) and answers with the outcome,
// after the outcome is committed here.
func (n *Node) handleIntent(ctx context.Context, peer string, m *Message) *Message {
	if m.Hop < 1 || m.Hop > maxHops {
		n.rejected(rejectf(rejectHops, "hop %d outside 1..%d", m.Hop, maxHops), peer)
		return errorReply(codeHopLimit, "intent exceeded the federation hop limit")
	}
	if slices.Contains(m.Path, n.cfg.Domain) {
		n.rejected(rejectf(rejectLoop, "path %v already crossed %s", m.Path, n.cfg.Domain), peer)
		return errorReply(codeLoop, "intent already crossed "+n.cfg.Domain)
	}
	f, err := wire.DecodeIntentFrame([]byte(m.Frame))
	if err != nil || f.Nonce != m.Nonce {
		n.rejected(rejectf(rejectMalformed, "frame: %v", err), peer)
		return errorReply(directory.CodeInvalidIntent, "forwarded frame is not a valid intent for its nonce")
	}
	if d, err := domainOf(f.From); err != nil || d != peer {
		n.rejected(rejectf(rejectSender, "%s may not forward intents from %s", peer, truncate(f.From)), peer)
		return errorReply(directory.CodeForbidden, "a directory forwards only its own agents' intents")
	}
	if d, err := domainOf(f.To); err != nil || d != n.cfg.Domain {
		n.rejected(rejectf(rejectMisaddressed, "recipient %s is not served here", truncate(f.To)), peer)
		return errorReply(directory.CodeOffline, "recipient "+f.To+" is not served by "+n.cfg.Domain)
	}
	pub, err := n.resolveKey(ctx, peer, f.From)
	if err != nil {
		n.lg.Warn("resolve sender key", "peer", peer, "sender", f.From, "err", err)
		return errorReply(codeSenderUnresolved, "could not resolve the key of "+f.From+" from "+peer)
	}
	extra := map[string]any{"peer": peer, "hop": m.Hop, "originEventId": m.EventID}
	opts := directory.RelayOptions{Origin: directory.OriginFederation, Extra: extra}
	if at, ok := n.admitted(m); ok {
		opts.AdmittedAt = at
	}
	switch {
	case m.JWS != "":
		// A beam/2 intent: the relay verifies the sender's JWS against
		// the resolved key and delivers it verbatim.
		if err := verifyIntentJWS(m.JWS, f, pub); err != nil {
			n.forgetKey(f.From)
			pub2, e := n.resolveKey(ctx, peer, f.From)
			if e != nil || verifyIntentJWS(m.JWS, f, pub2) != nil {
				n.rejected(rejectf(rejectSender, "JWS of %s on %s does not verify: %v", f.From, f.Nonce, err), peer)
				return errorReply(directory.CodeInvalidIntent, "JWS verification failed")
			}
			pub = pub2
		}
		opts.JWS = m.JWS
	case f.Signature != "":
		if err := f.Verify(pub); err != nil {
			// Try once more with a fresh key: the agent may have rotated.
			n.forgetKey(f.From)
			pub2, e := n.resolveKey(ctx, peer, f.From)
			if e != nil || f.Verify(pub2) != nil {
				n.rejected(rejectf(rejectSender, "signature of %s on %s does not verify", f.From, f.Nonce), peer)
				return errorReply(directory.CodeInvalidIntent, directory.BadSignatureMessage(f, registry.Agent{BeamID: f.From}))
			}
			pub = pub2
		}
		// Relay verifies it again against opts.Sender, the key it just
		// verified with.
	default:
		// Unsigned frames (a durable send) are vouched for by the origin
		// directory's signature on the message.
		opts = opts.VouchedByPeer(peer)
		extra["vouchedBy"] = peer
		if m.VouchedAuth != "" {
			extra["vouchedAuth"] = truncate(m.VouchedAuth)
		}
	}
	sender := directory.RemoteSender(f.From, pub)
	opts.Sender = &sender
	timeout := time.Duration(m.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = n.cfg.DurableTimeout
	}
	opts.Timeout = min(max(timeout, time.Second), maxIntentTimeout)
	res, rerr := n.cfg.Directory.Relay(ctx, f, opts)
	if rerr == nil {
		return &Message{Status: statusResult, Result: string(res), Delivered: true, ResultJWS: n.resultJWS(ctx, f.Nonce)}
	}
	out := errorReply(rerr.Code, rerr.Message)
	out.Result = string(rerr.Result)
	out.Delivered = n.wasDelivered(ctx, f.Nonce)
	return out
}

// verifyIntentJWS checks a forwarded beam/2 envelope: signed by the
// frame's sender with pub, its payload byte for byte the forwarded frame.
func verifyIntentJWS(token string, f *wire.IntentFrame, pub ed25519.PublicKey) error {
	payload, _, err := wire.VerifyJWS(token, wire.TypIntentJWS, func(kid string) (ed25519.PublicKey, error) {
		if kid != f.From {
			return nil, errors.New("kid is not the intent's sender")
		}
		return pub, nil
	})
	if err != nil {
		return err
	}
	if !bytes.Equal(payload, f.Raw) {
		return errors.New("payload is not the forwarded frame")
	}
	return nil
}

// resultJWS returns the recipient's beam/2 result JWS this directory
// recorded for nonce, or "".
func (n *Node) resultJWS(ctx context.Context, nonce string) string {
	trace, err := n.cfg.Log.Trace(ctx, nonce)
	if err != nil {
		return ""
	}
	for i := len(trace) - 1; i >= 0; i-- {
		if t, ok := trace[i].Details.Extra["resultJWS"].(string); ok {
			return t
		}
	}
	return ""
}

// wasDelivered reports whether this directory recorded delivered for nonce.
func (n *Node) wasDelivered(ctx context.Context, nonce string) bool {
	trace, err := n.cfg.Log.Trace(ctx, nonce)
	if err != nil {
		return false
	}
	for _, ev := range trace {
		if ev.State == tracing.Delivered {
			return true
		}
	}
	return false
}

// handleResolve answers with the current key of one of this directory's
// agents.
func (n *Node) handleResolve(peer string, m *Message) *Message {
	if d, err := domainOf(m.BeamID); err != nil || d != n.cfg.Domain {
		return errorReply(codeUnknownAgent, "not an agent of "+n.cfg.Domain)
	}
	a, ok := n.cfg.Registry.Get(m.BeamID)
	if !ok {
		return errorReply(codeUnknownAgent, "no agent "+m.BeamID)
	}
	return &Message{Status: statusResult, BeamID: a.BeamID, PublicKey: wire.EncodePublicKey(a.PublicKey)}
}

func (n *Node) forgetKey(beamID string) {
	n.mu.Lock()
	delete(n.keys, beamID)
	n.mu.Unlock()
}

// resolveKey returns the current key of a peer's agent: from the cache
// (KeyTTL), else by a signed resolve request to the agent's home directory.
func (n *Node) resolveKey(ctx context.Context, peer, beamID string) (ed25519.PublicKey, error) {
	now := n.clock()
	n.mu.Lock()
	ck, ok := n.keys[beamID]
	n.mu.Unlock()
	if ok && now.Sub(ck.fetched) < n.cfg.KeyTTL {
		n.m.keyCache.WithLabelValues("hit").Inc()
		return ck.pub, nil
	}
	n.m.keyCache.WithLabelValues("miss").Inc()
	conn, ok := n.connFor(peer)
	if !ok {
		return nil, errors.New("no connection to " + peer)
	}
	req := &Message{Kind: KindResolve, ID: newID(), From: n.cfg.Domain, To: peer,
		IssuedAt: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli(), BeamID: beamID}
	tok, err := seal(req, n.cfg.Key)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, defaultResolveTimeout)
	defer cancel()
	reply, err := conn.RequestWithContext(rctx, Subject(peer, n.cfg.Domain, KindResolve), tok)
	if err != nil {
		return nil, err
	}
	res, err := open(reply.Data, n.cfg.Domain, peer, kindResult, n.pinnedKey, n.clock())
	if err == nil && res.Re != req.ID {
		err = rejectf(rejectMisaddressed, "reply answers %q", truncate(res.Re))
	}
	if err != nil {
		n.rejected(err, peer)
		return nil, err
	}
	if res.Status != statusResult || res.BeamID != beamID {
		return nil, errors.New(peer + " answered " + res.ErrorCode + ": " + res.Error)
	}
	pub, err := wire.ParsePublicKey(res.PublicKey)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.keys[beamID] = cachedKey{pub: pub, fetched: now}
	n.mu.Unlock()
	return pub, nil
}

// admitted returns the instant the origin admitted a durable frame, which
// the target uses for the frame's replay window: a bus-owned send may wait
// out a long outage of this directory, and the origin's signature on the
// message vouches for when its own checks passed. Instants in the future
// or older than DurableMaxAge are not honoured.
func (n *Node) admitted(m *Message) (time.Time, bool) {
	if m.Owner != string(tracing.OwnerBus) || m.Admitted <= 0 {
		return time.Time{}, false
	}
	at, now := time.UnixMilli(m.Admitted), n.clock()
	if at.After(now.Add(maxClockSkew)) || now.Sub(at) > n.cfg.DurableMaxAge {
		return time.Time{}, false
	}
	return at, true
}

// lookupRemote resolves a peer's agent for the registry's lookup endpoint
// (cached like the keys of forwarded senders).
func (n *Node) lookupRemote(ctx context.Context, beamID string) (registry.RemoteKey, bool) {
	peer, ok := n.PeerFor(beamID)
	if !ok {
		return registry.RemoteKey{}, false
	}
	pub, err := n.resolveKey(ctx, peer, beamID)
	if err != nil {
		n.lg.Debug("lookup of a peer's agent", "peer", peer, "beamId", beamID, "err", err)
		return registry.RemoteKey{}, false
	}
	return registry.RemoteKey{BeamID: beamID, PublicKey: wire.EncodePublicKey(pub), Directory: peer, Remote: true}, true
}
