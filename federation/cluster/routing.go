package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/beamdir/beam/directory"
)

// Routing: the sessions bucket (BEAM_SESSIONS_<domain token>) maps each
// connected agent to the node that holds its session; the holder writes the
// entry when the session opens, refreshes it while it lasts and deletes it
// when it closes if the entry is still its own. Every node watches the
// bucket into memory, so finding the holder costs no round trip; an entry
// older than sessionTTL (its holder died) or of a node missing from the
// nodes bucket is ignored. An intent for an agent another node holds is a
// NATS request to that node's intent subject (directory.NodeRouter).
//
// A session entry names the agent it is for, and is taken only under that
// agent's key: a copy of one agent's entry under another's is refused.
//
// The nonces bucket (BEAM_NONCES_<domain token>, TTL = the replay window
// and then some) holds one key per accepted (sender, nonce), its value a
// claim sealed by the node that accepted it and naming the key: the write
// succeeds only when the key never had a value within the TTL (a deleted
// claim leaves a marker that still counts), so a nonce accepted on one
// node is refused on another; the node that accepted it keeps its own
// replay semantics. A value that is not a member's claim for that key, or
// a claim deleted, counts as another node's: at worst a forged value
// refuses a frame, it never lets one in twice.

// Defaults of routing.
const (
	sessionTTL     = 30 * time.Second
	sessionRefresh = 10 * time.Second
	nonceTTL       = 2*directory.ReplayWindow + time.Minute
	maxHandOvers   = 256
)

// sessionEntry is one value of the sessions bucket.
type sessionEntry struct {
	Agent string    `json:"agent"` // the Beam ID whose session it is
	Node  string    `json:"node"`
	At    time.Time `json:"at"`
}

// nonceClaim is one value of the nonces bucket.
type nonceClaim struct {
	Key  string `json:"key"` // the bucket key it claims
	Node string `json:"node"`
}

// router is the node's part of routing.
type router struct {
	sessions  jetstream.KeyValue
	nonces    jetstream.KeyValue
	delivered jetstream.KeyValue
	sub       *nats.Subscription
	slots     chan struct{}

	mu    sync.Mutex
	where map[string]sessionEntry // beam ID → holder (from the watch)
	held  map[string]bool         // sessions this node holds
	dirty map[string]bool         // held changes to write
	kick  chan struct{}
	live  map[string]bool // nodes in the nodes bucket
}

func sessionKey(beamID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(beamID))
}

func (n *Node) intentSubject(nodeID string) string {
	return "beam.cluster." + Token(n.cfg.Domain) + ".node." + nodeID + ".intent"
}

// startRouting creates the buckets, watches the sessions, answers hand-overs
// and points the directory's Router at this node.
func (n *Node) startRouting(ctx, runCtx context.Context) error {
	tok := Token(n.cfg.Domain)
	var err error
	rt := &n.route
	rt.where, rt.held, rt.dirty = map[string]sessionEntry{}, map[string]bool{}, map[string]bool{}
	rt.kick, rt.slots = make(chan struct{}, 1), make(chan struct{}, maxHandOvers)
	if rt.sessions, err = createKV(ctx, n.js, jetstream.KeyValueConfig{Bucket: "BEAM_SESSIONS_" + tok,
		TTL: sessionTTL, Replicas: n.Replicas(), Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	if rt.nonces, err = createKV(ctx, n.js, jetstream.KeyValueConfig{Bucket: "BEAM_NONCES_" + tok,
		TTL: nonceTTL, Replicas: n.Replicas(), Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	if rt.delivered, err = createKV(ctx, n.js, jetstream.KeyValueConfig{Bucket: "BEAM_DELIVERED_" + tok,
		TTL: deliveredTTL, Replicas: n.Replicas(), Storage: jetstream.FileStorage}); err != nil {
		return err
	}
	w, err := rt.sessions.WatchAll(runCtx)
	if err != nil {
		return fmt.Errorf("cluster: watch sessions: %w", err)
	}
	rt.sub, err = n.nc.Subscribe(n.intentSubject(n.cfg.NodeID), func(m *nats.Msg) { n.onHandOver(runCtx, m) })
	if err != nil {
		_ = w.Stop()
		return fmt.Errorf("cluster: subscribe hand-overs: %w", err)
	}
	rt.sub.SetPendingLimits(16384, 64<<20)
	if n.callSub, err = n.nc.Subscribe(n.callSubject(n.cfg.NodeID), func(m *nats.Msg) { n.onCall(runCtx, m) }); err != nil {
		_ = w.Stop()
		return fmt.Errorf("cluster: subscribe bus calls: %w", err)
	}
	if err := n.startStreams(runCtx); err != nil {
		_ = w.Stop()
		return err
	}
	if n.cfg.Router != nil {
		n.cfg.Router.join(n)
	}
	// The watch is read only now: a session it reports wakes the messages
	// waiting for that agent, and they find it only through the router
	// installed above.
	n.wg.Add(2)
	go func() {
		defer n.wg.Done()
		for e := range w.Updates() {
			if e == nil {
				continue // the initial values are in
			}
			n.noteSession(e)
		}
	}()
	go func() {
		defer n.wg.Done()
		n.writeSessions(runCtx)
	}()
	return nil
}

// noteSession applies one change of the sessions bucket to memory.
func (n *Node) noteSession(e jetstream.KeyValueEntry) {
	raw, err := base64.RawURLEncoding.DecodeString(e.Key())
	if err != nil {
		return
	}
	var se sessionEntry
	if e.Operation() == jetstream.KeyValuePut {
		var ok bool
		if se, ok = n.sessionOf(string(raw), e.Value()); !ok {
			return
		}
	}
	if n.route.note(n.cfg.NodeID, string(raw), se, e.Operation() == jetstream.KeyValuePut) {
		n.sessionReachable(string(raw))
	}
}

// sessionOf returns the sessions bucket entry value holds under beamID's
// key if the node it names sealed it for beamID; anything else is refused
// and counted.
func (n *Node) sessionOf(beamID string, value []byte) (sessionEntry, bool) {
	var se sessionEntry
	err := n.openAs(typSession, value, &se, func() string { return se.Node })
	if err == nil && se.Agent != beamID {
		err = fmt.Errorf("%w: session entry of %q under the key of %q", errUnsealed, se.Agent, beamID)
	}
	if err != nil {
		n.refuse("session", err)
		return sessionEntry{}, false
	}
	return se, true
}

// note records se as where id's session is held (put), or forgets it. It
// reports whether the session became reachable on another node: it was
// not before (no entry, another node, or an entry gone stale while its
// holder could not refresh it), so the messages waiting here for the agent
// go there now.
func (rt *router) note(self, id string, se sessionEntry, put bool) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !put {
		delete(rt.where, id)
		return false
	}
	prev, had := rt.where[id]
	rt.where[id] = se
	return rt.reachable(self, se) && !(had && prev.Node == se.Node && rt.reachable(self, prev))
}

// reachable reports whether se names another node that holds the session
// (as NodeFor finds it). The caller holds rt.mu.
func (rt *router) reachable(self string, se sessionEntry) bool {
	return se.Node != self && time.Since(se.At) <= sessionTTL && (rt.live == nil || rt.live[se.Node])
}

// sessionReachable wakes the messages waiting on this node for beamID,
// whose session another node holds.
func (n *Node) sessionReachable(beamID string) {
	if n.cfg.Directory != nil {
		go n.cfg.Directory.RemoteSessionUp(beamID)
	}
}

// writeSessions writes this node's session changes and refreshes the
// entries of the sessions it holds until ctx ends.
func (n *Node) writeSessions(ctx context.Context) {
	rt := &n.route
	t := time.NewTicker(sessionRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rt.kick:
		case <-t.C:
			rt.mu.Lock()
			for id := range rt.held {
				rt.dirty[id] = true
			}
			rt.mu.Unlock()
		}
		rt.mu.Lock()
		batch := rt.dirty
		rt.dirty = map[string]bool{}
		held := make(map[string]bool, len(batch))
		for id := range batch {
			held[id] = rt.held[id]
		}
		rt.mu.Unlock()
		for id, up := range held {
			if err := n.writeSession(ctx, id, up); err != nil && ctx.Err() == nil {
				n.lg.Warn("announce session", "beamId", id, "up", up, "err", err)
				rt.mu.Lock()
				rt.dirty[id] = true
				rt.mu.Unlock()
			}
		}
	}
}

// writeSession puts this node as id's holder, or deletes the entry if it
// is still this node's.
func (n *Node) writeSession(ctx context.Context, id string, up bool) error {
	kv := n.route.sessions
	key := sessionKey(id)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if up {
		tok, err := n.seal(typSession, sessionEntry{Agent: id, Node: n.cfg.NodeID, At: time.Now().UTC()})
		if err != nil {
			return err
		}
		_, err = kv.Put(wctx, key, []byte(tok))
		return err
	}
	e, err := kv.Get(wctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if se, ok := n.sessionOf(id, e.Value()); !ok || se.Node != n.cfg.NodeID {
		return nil
	}
	err = kv.Delete(wctx, key, jetstream.LastRevision(e.Revision()))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return err
	}
	return nil
}

// SessionUp records that this node holds beamID's session
// (directory.NodeRouter).
func (n *Node) SessionUp(beamID string) { n.sessionChanged(beamID, true) }

// SessionDown records that this node's session of beamID ended
// (directory.NodeRouter).
func (n *Node) SessionDown(beamID string) { n.sessionChanged(beamID, false) }

func (n *Node) sessionChanged(beamID string, up bool) {
	rt := &n.route
	rt.mu.Lock()
	if up {
		rt.held[beamID] = true
		rt.where[beamID] = sessionEntry{Agent: beamID, Node: n.cfg.NodeID, At: time.Now().UTC()}
	} else {
		delete(rt.held, beamID)
		if rt.where[beamID].Node == n.cfg.NodeID {
			delete(rt.where, beamID)
		}
	}
	rt.dirty[beamID] = true
	rt.mu.Unlock()
	select {
	case rt.kick <- struct{}{}:
	default:
	}
}

// NodeFor returns the other live node holding beamID's session
// (directory.NodeRouter).
func (n *Node) NodeFor(beamID string) (string, bool) {
	rt := &n.route
	rt.mu.Lock()
	defer rt.mu.Unlock()
	se, ok := rt.where[beamID]
	if !ok || !rt.reachable(n.cfg.NodeID, se) {
		return "", false
	}
	return se.Node, true
}

// setLive records the nodes present in the nodes bucket. The sessions of
// a node that rejoins it (its entry had expired while it could not refresh
// it) become reachable again, and the messages waiting for them are woken.
func (n *Node) setLive(nodes []NodeInfo) {
	live := make(map[string]bool, len(nodes))
	for _, info := range nodes {
		live[info.NodeID] = true
	}
	for _, id := range n.route.setLive(n.cfg.NodeID, live) {
		n.sessionReachable(id)
	}
}

// setLive installs live and returns the agents whose sessions it makes
// reachable: held by a node that was not live before.
func (rt *router) setLive(self string, live map[string]bool) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	prev := rt.live
	rt.live = live
	if prev == nil {
		return nil // every node counted as live until now
	}
	back := false
	for node := range live {
		back = back || !prev[node]
	}
	if !back {
		return nil // the common case: no walk over every session
	}
	var woken []string
	for id, se := range rt.where {
		if !prev[se.Node] && rt.reachable(self, se) {
			woken = append(woken, id)
		}
	}
	return woken
}

// Sessions returns where each agent's session is held, as this node knows
// it (agent → node).
func (n *Node) Sessions() map[string]string {
	rt := &n.route
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make(map[string]string, len(rt.where))
	for id, se := range rt.where {
		if time.Since(se.At) <= sessionTTL && (rt.live == nil || rt.live[se.Node]) {
			out[id] = se.Node
		}
	}
	return out
}

// Hand relays h on node over NATS (directory.NodeRouter).
func (n *Node) Hand(ctx context.Context, node string, h directory.HandOver) (directory.HandReply, error) {
	h.FromNode = n.cfg.NodeID
	b, err := json.Marshal(h)
	if err != nil {
		return directory.HandReply{}, fmt.Errorf("encode hand-over: %w", err)
	}
	exp := time.Now().Add(time.Duration(h.TimeoutMs)*time.Millisecond + callTTL)
	tok, err := n.seal(typHandOver, handSeal{To: node, Exp: exp.Unix(), Digest: digest(b)})
	if err != nil {
		return directory.HandReply{}, err
	}
	req := &nats.Msg{Subject: n.intentSubject(node), Data: b, Header: nats.Header{headerSeal: []string{tok}}}
	msg, err := n.nc.RequestMsgWithContext(ctx, req)
	if err != nil {
		return directory.HandReply{}, fmt.Errorf("hand over to %s: %w", node, err)
	}
	var rep directory.HandReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return directory.HandReply{}, fmt.Errorf("hand-over reply of %s: %w", node, err)
	}
	return rep, nil
}

// openHandOver checks that a member sealed m's data for this node, and
// recently.
func (n *Node) openHandOver(m *nats.Msg) error {
	from, payload, err := n.open(typHandOver, []byte(m.Header.Get(headerSeal)))
	if err != nil {
		return err
	}
	var hs handSeal
	if err := json.Unmarshal(payload, &hs); err != nil {
		return fmt.Errorf("hand-over of %s: %w", from, err)
	}
	switch {
	case hs.To != n.cfg.NodeID || hs.Digest != digest(m.Data):
		return fmt.Errorf("hand-over of %s is for node %s or other data", from, hs.To)
	case hs.Exp < time.Now().Unix():
		return fmt.Errorf("hand-over of %s expired", from)
	}
	return nil
}

// onHandOver relays an intent another node handed over and answers with
// its outcome.
func (n *Node) onHandOver(ctx context.Context, m *nats.Msg) {
	if err := n.openHandOver(m); err != nil {
		n.refuse("handover", err)
		rep, _ := json.Marshal(directory.HandReply{Error: &directory.RelayError{Code: directory.CodeInvalidIntent,
			Message: "hand-over not signed by a member of the cluster"}})
		_ = m.Respond(rep)
		return
	}
	var h directory.HandOver
	if err := json.Unmarshal(m.Data, &h); err != nil || n.cfg.Directory == nil {
		rep, _ := json.Marshal(directory.HandReply{Error: &directory.RelayError{Code: directory.CodeInvalidIntent, Message: "unreadable hand-over"}})
		_ = m.Respond(rep)
		return
	}
	select {
	case n.route.slots <- struct{}{}:
	default:
		rep, _ := json.Marshal(directory.HandReply{Error: &directory.RelayError{Code: directory.CodeDeliveryFailed, Message: "node busy"}})
		_ = m.Respond(rep)
		return
	}
	go func() {
		defer func() { <-n.route.slots }()
		timeout := time.Duration(h.TimeoutMs)*time.Millisecond + time.Second
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		rep, err := json.Marshal(n.cfg.Directory.RelayHandOver(rctx, h))
		if err != nil {
			n.lg.Warn("encode hand-over reply", "err", err)
			return
		}
		_ = m.Respond(rep)
	}()
}

// ClaimNonce records the nonce of from for this node; false when another
// node recorded it first (directory.NodeRouter).
func (n *Node) ClaimNonce(ctx context.Context, from, nonce string) (bool, error) {
	key := nonceKey(from, nonce)
	kv := n.route.nonces
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tok, err := n.seal(typNonce, nonceClaim{Key: key, Node: n.cfg.NodeID})
	if err != nil {
		return false, err
	}
	// Revision 0: only a key without any entry, not even a delete marker.
	_, err = kv.Update(cctx, key, []byte(tok), 0)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
		return false, fmt.Errorf("claim nonce: %w", err)
	}
	e, err := kv.Get(cctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		n.refuse("nonce", errors.New("nonce claim deleted"))
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read nonce claim: %w", err)
	}
	var c nonceClaim
	err = n.openAs(typNonce, e.Value(), &c, func() string { return c.Node })
	if err == nil && c.Key != key {
		err = fmt.Errorf("%w: nonce claim for key %s under key %s", errUnsealed, c.Key, key)
	}
	if err != nil {
		n.refuse("nonce", err)
		return false, nil
	}
	// The node that accepted the nonce answers its replays itself.
	return c.Node == n.cfg.NodeID, nil
}

// nonceKey is the key of from's nonce in the nonces and delivered buckets.
func nonceKey(from, nonce string) string {
	sum := sha256.Sum256([]byte(from + "\x00" + nonce))
	return hex.EncodeToString(sum[:20])
}
