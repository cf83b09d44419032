package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
)

// The bus across nodes, for consumers that poll: a message belongs to the
// node that accepted it, and a consumer may poll any node. Poll answers
// with this node's messages first and then asks the other live nodes (the
// same request with the remaining limit), so leases are taken where the
// messages live; ack, lease renewal and message status go to this node
// and, when it does not know the message, to the others in turn.
//
// These node calls travel over the cluster's NATS (the routes between the
// embedded servers are TLS 1.3 with the cluster's certificates), on the
// receiving node's call subject, never over HTTP: a node's HTTP listener
// refuses a request that claims to be one. A call never carries the
// client's credentials. The forwarding node authenticated the client and
// sends, in headerSeal, a token sealed with the cluster's key (seal.go)
// naming a random call ID, the receiving node, the request (method, path,
// query, body digest), the principal (the agent's Beam ID, or the
// operator) and a short expiry; the receiving node verifies it, takes each
// call ID once (callLedger), acts as that principal and answers locally
// only, so nothing is forwarded twice. The answer comes back in chunks
// that fit a NATS message, the last one sealed by the answering node with
// the call ID, status and body digest. Nodes are only those whose entries
// in the nodes bucket the cluster's key signed (nodes.go).

// headerCall is the header by which an HTTP request claims to be a node's
// call; nodes call each other over NATS only, so such a request is refused.
const headerCall = "X-Beam-Cluster-Call"

// headerChunk numbers the chunks of a call's answer ("i/n", from 1).
const headerChunk = "Beam-Chunk"

// answerHeaders are the headers of an answer a call carries back: its
// type, when to retry, and the job bus's own (allowed methods, the admin
// realm, RFC §10's security headers).
var answerHeaders = []string{"Content-Type", "Retry-After", "Allow", "WWW-Authenticate",
	"X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy", "Cache-Control", "X-Intent-Version"}

// forwardTimeout bounds one forwarded bus request.
const forwardTimeout = 5 * time.Second

// maxForwardBody bounds the body of a forwarded bus request.
const maxForwardBody = 1 << 20

// callTTL is how long a forwarded request's token is valid.
const callTTL = 30 * time.Second

// maxCallsRemembered bounds the call IDs a node remembers (each until its
// token expires); past it, calls are refused until some expire.
const maxCallsRemembered = 1 << 17

// callRoom is what a call message keeps free for its headers.
const callRoom = 8 << 10

// maxCallsServed bounds the calls a node answers at once.
const maxCallsServed = 256

// nodeCall is the payload of a call's token.
type nodeCall struct {
	ID        string                 `json:"jti"` // random; taken once
	To        string                 `json:"to"`  // the receiving node's ID
	Method    string                 `json:"method"`
	Path      string                 `json:"path"`  // escaped, as the client sent it
	Query     string                 `json:"query"` // raw
	Body      string                 `json:"body"`  // hex SHA-256 of the body
	Principal directory.BusPrincipal `json:"principal"`
	Iat       int64                  `json:"iat"` // Unix seconds
	Exp       int64                  `json:"exp"` // Unix seconds
	// LastEventID is the client's Last-Event-ID (a forwarded event stream
	// resumes after it).
	LastEventID string `json:"lastEventId,omitempty"`

	url *url.URL // Path and Query parsed (verifyCall)
}

// route is the call's route (meshRoute) as the answering node reads it.
func (c nodeCall) route() meshKind {
	if c.url == nil {
		return meshLocal
	}
	return meshRoute(c.Method, c.url.Path)
}

// request rebuilds the client's request from the call and body (callRequest).
func (c nodeCall) request(ctx context.Context, body []byte) (*http.Request, error) {
	return callRequest(ctx, c.Method, c.Path, c.Query, body)
}

// callReply is the payload of the seal on a call's last answer chunk.
type callReply struct {
	Call   string `json:"call"` // the call's ID
	To     string `json:"to"`   // the calling node's ID
	Status int    `json:"status"`
	Body   string `json:"body"` // hex SHA-256 of the whole answer body
}

// callLedger remembers the call IDs a node took, each until its token
// expires, so a captured call is answered once.
type callLedger struct {
	mu    sync.Mutex
	seen  map[string]int64 // call ID → expiry (Unix seconds)
	swept int64
}

// take records id (valid until exp) and fails if it was taken before or
// the ledger is full of unexpired calls.
func (l *callLedger) take(id string, exp int64, now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]int64{}
	}
	if _, ok := l.seen[id]; ok {
		return fmt.Errorf("call %s replayed", id)
	}
	if unix := now.Unix(); len(l.seen) >= maxCallsRemembered || unix-l.swept >= int64(callTTL/time.Second) {
		for k, e := range l.seen {
			if e < unix {
				delete(l.seen, k)
			}
		}
		l.swept = unix
	}
	if len(l.seen) >= maxCallsRemembered {
		return errors.New("too many calls in flight")
	}
	l.seen[id] = exp
	return nil
}

func digest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// forwardable reports whether method and path are a bus or pipeline
// gateway route nodes forward to each other.
func forwardable(method, path string) bool {
	return meshRoute(method, path) != meshLocal || method == http.MethodPost && (path == "/v1/beam/ack" || path == "/v1/beam/lease") ||
		method == http.MethodGet && (path == "/v1/beam/poll" || strings.HasPrefix(path, "/v1/beam/messages/"))
}

func (n *Node) callSubject(nodeID string) string {
	return "beam.cluster." + Token(n.cfg.Domain) + ".node." + nodeID + ".call"
}

// BusHandler wraps the directory's handler so that the bus's poll, ack,
// lease and message routes reach the messages of every node, and the
// pipeline gateway's routes every node's envelopes (meshproxy.go); next also
// answers the calls other nodes send this one. auth tells who a client's
// credentials authenticate (bus.Bus.Principal).
func (n *Node) BusHandler(next http.Handler, auth func(*http.Request) (directory.BusPrincipal, bool)) http.Handler {
	n.callNext.Store(&next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get(headerCall) != "":
			n.refuse("call", errors.New("a node call over HTTP"), "path", r.URL.Path)
			httpjson.WriteError(w, http.StatusUnauthorized, "UNAUTHORIZED", "nodes call each other over the cluster's NATS, not HTTP")
		case meshRoute(r.Method, r.URL.Path) != meshLocal:
			n.meshCall(w, r, next, meshRoute(r.Method, r.URL.Path))
		case !forwardable(r.Method, r.URL.Path):
			next.ServeHTTP(w, r)
		case r.URL.Path == "/v1/beam/poll":
			n.pollAll(w, r, next, auth)
		default:
			n.firstKnown(w, r, next, auth)
		}
	})
}

// onCall answers a request another node sent on this node's call subject,
// as the principal its token names, once the token proves the sender a
// member and the call new.
func (n *Node) onCall(ctx context.Context, m *nats.Msg) {
	from, c, err := n.verifyCall(m.Header.Get(headerSeal), m.Data, time.Now())
	next := n.callNext.Load()
	if err == nil && next == nil {
		err = errors.New("this node serves no bus")
	}
	if err == nil && c.route() == meshEvents {
		err = errors.New("an event stream is called on the stream subject")
	}
	if err != nil {
		n.refuse("call", err, "path", c.Path)
		n.answerErr(m, from, c.ID, httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "cluster request not signed by a member"))
		return
	}
	select {
	case n.callSlots <- struct{}{}:
	default:
		n.answerErr(m, from, c.ID, httpjson.New(http.StatusServiceUnavailable, "BUSY", "node busy"))
		return
	}
	go func() {
		defer func() { <-n.callSlots }()
		rctx, cancel := context.WithTimeout(directory.WithBusPrincipal(ctx, c.Principal), forwardTimeout)
		defer cancel()
		r, err := c.request(rctx, m.Data)
		if err != nil {
			n.answerErr(m, from, c.ID, httpjson.New(http.StatusBadRequest, "INVALID_REQUEST", "bad call"))
			return
		}
		if v := m.Header.Get("Content-Type"); v != "" {
			r.Header.Set("Content-Type", v)
		}
		rec := serveCaptured(*next, r)
		if rec.overflow {
			n.answerErr(m, from, c.ID, httpjson.New(http.StatusBadGateway, "TOO_LARGE", "answer too large"))
			return
		}
		n.answer(m, from, c.ID, rec.code(), rec.header, rec.body)
	}()
}

// answer sends a call's answer to its reply subject in chunks that fit a
// NATS message, the last sealed with the call ID, status and body digest.
// answerErr answers a call with e in the Beam error shape.
func (n *Node) answerErr(m *nats.Msg, to, call string, e *httpjson.Error) {
	n.answer(m, to, call, e.Status, nil, e.Marshal())
}

func (n *Node) answer(m *nats.Msg, to, call string, status int, hdr http.Header, body []byte) {
	if m.Reply == "" {
		return
	}
	size := max(int(n.nc.MaxPayload())-callRoom, 1<<10)
	chunks := max(1, (len(body)+size-1)/size)
	for i := range chunks {
		part := body[min(i*size, len(body)):min((i+1)*size, len(body))]
		msg := &nats.Msg{Subject: m.Reply, Data: part, Header: nats.Header{headerChunk: {fmt.Sprintf("%d/%d", i+1, chunks)}}}
		if i == chunks-1 {
			tok, err := n.seal(typCallReply, callReply{Call: call, To: to, Status: status, Body: digest(body)})
			if err != nil {
				n.lg.Warn("bus: seal a call's answer", "err", err)
				return
			}
			msg.Header.Set(headerSeal, tok)
			for _, k := range answerHeaders {
				if v := hdr.Get(k); v != "" {
					msg.Header.Set(k, v)
				}
			}
		}
		if err := n.nc.PublishMsg(msg); err != nil {
			n.lg.Warn("bus: answer a call", "to", to, "err", err)
			return
		}
	}
}

// verifyCall checks a call's token against its body and this node, and
// takes its ID; it returns the calling node and the call.
func (n *Node) verifyCall(token string, body []byte, now time.Time) (string, nodeCall, error) {
	var c nodeCall
	from, payload, err := n.open(typNodeCall, []byte(token))
	if err != nil {
		return "", c, err
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return from, c, fmt.Errorf("call from %s: %w", from, err)
	}
	if c.url, _, err = callURL(c.Path, c.Query); err != nil {
		return from, c, fmt.Errorf("call from %s: %w", from, err)
	}
	switch {
	case from == n.cfg.NodeID || c.To != n.cfg.NodeID:
		return from, c, fmt.Errorf("call from %s is for node %s", from, c.To)
	case !forwardable(c.Method, c.url.Path) || c.Body != digest(body):
		return from, c, fmt.Errorf("call from %s is for another request", from)
	case c.Exp < now.Unix() || c.Exp > now.Add(2*callTTL).Unix():
		return from, c, fmt.Errorf("call from %s expired or too far ahead", from)
	case c.Iat < n.started.Unix():
		// Calls taken before a restart are forgotten; none older passes.
		return from, c, fmt.Errorf("call from %s issued before this node started", from)
	case !c.Principal.Valid():
		return from, c, fmt.Errorf("call from %s names no principal", from)
	case len(c.ID) < 16:
		return from, c, fmt.Errorf("call from %s has no ID", from)
	}
	if err := n.calls.take(c.ID, c.Exp, now); err != nil {
		return from, c, fmt.Errorf("call from %s: %w", from, err)
	}
	return from, c, nil
}

// others returns the other live nodes.
func (n *Node) others(ctx context.Context) []NodeInfo {
	nodes, err := n.Nodes(ctx)
	if err != nil {
		n.lg.Warn("bus: list nodes", "err", err)
		return nil
	}
	var out []NodeInfo
	for _, info := range nodes {
		if info.NodeID != n.cfg.NodeID {
			out = append(out, info)
		}
	}
	return out
}

// newCall returns a new call of r (with query and body) to node as
// principal p, and its token.
func (n *Node) newCall(r *http.Request, node string, p directory.BusPrincipal, query string, body []byte) (nodeCall, string, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nodeCall{}, "", fmt.Errorf("call to %s: %w", node, err)
	}
	now := time.Now()
	c := nodeCall{ID: hex.EncodeToString(id), To: node, Method: r.Method, Path: r.URL.EscapedPath(), Query: query,
		Body: digest(body), Principal: p, Iat: now.Unix(), Exp: now.Add(callTTL).Unix(),
		LastEventID: r.Header.Get("Last-Event-ID")}
	tok, err := n.seal(typNodeCall, c)
	return c, tok, err
}

// forward sends r (with body and query) to node as principal p and
// returns its answer.
func (n *Node) forward(ctx context.Context, r *http.Request, node NodeInfo, p directory.BusPrincipal,
	query string, body []byte) (int, http.Header, []byte, error) {
	if len(body) > int(n.nc.MaxPayload())-callRoom {
		return 0, nil, nil, fmt.Errorf("call to %s: body of %d bytes does not fit a message", node.NodeID, len(body))
	}
	c, tok, err := n.newCall(r, node.NodeID, p, query, body)
	if err != nil {
		return 0, nil, nil, err
	}
	msg := &nats.Msg{Subject: n.callSubject(node.NodeID), Data: body, Header: nats.Header{headerSeal: {tok}}}
	if v := r.Header.Get("Content-Type"); v != "" {
		msg.Header.Set("Content-Type", v)
	}
	return n.call(ctx, msg, node.NodeID, c.ID, forwardTimeout)
}

// call sends msg to node and returns its answer: the chunks in order, the
// last one sealed by node over the call ID, this node, the status and the
// body's digest, within timeout.
func (n *Node) call(ctx context.Context, msg *nats.Msg, node, callID string, timeout time.Duration) (int, http.Header, []byte, error) {
	inbox := n.nc.NewRespInbox()
	sub, err := n.nc.SubscribeSync(inbox)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("call to %s: %w", node, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg.Reply = inbox
	if err := n.nc.PublishMsg(msg); err != nil {
		return 0, nil, nil, fmt.Errorf("call to %s: %w", node, err)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out []byte
	for i := 1; ; i++ {
		m, err := sub.NextMsgWithContext(cctx)
		if err != nil {
			return 0, nil, nil, fmt.Errorf("call to %s: %w", node, err)
		}
		if m.Header.Get("Status") == "503" {
			return 0, nil, nil, fmt.Errorf("call to %s: %w", node, nats.ErrNoResponders)
		}
		var at, of int
		if _, err := fmt.Sscanf(m.Header.Get(headerChunk), "%d/%d", &at, &of); err != nil || at != i || of < i {
			return 0, nil, nil, fmt.Errorf("call to %s: answer chunk %q out of place", node, m.Header.Get(headerChunk))
		}
		if out = append(out, m.Data...); len(out) > maxCapturedBody {
			return 0, nil, nil, fmt.Errorf("call to %s: answer too large", node)
		}
		if at < of {
			continue
		}
		var rep callReply
		err = n.openAs(typCallReply, []byte(m.Header.Get(headerSeal)), &rep, func() string { return node })
		if err == nil && (rep.Call != callID || rep.To != n.cfg.NodeID || rep.Body != digest(out)) {
			err = fmt.Errorf("%w: answer of %s is for another call", errUnsealed, node)
		}
		if err != nil {
			n.refuse("answer", err)
			return 0, nil, nil, fmt.Errorf("call to %s: %w", node, err)
		}
		hdr := http.Header{}
		for _, k := range answerHeaders {
			if v := m.Header.Get(k); v != "" {
				hdr.Set(k, v)
			}
		}
		return rep.Status, hdr, out, nil
	}
}

// pollAll answers a poll with this node's messages and then the other
// nodes', up to the limit.
func (n *Node) pollAll(w http.ResponseWriter, r *http.Request, next http.Handler,
	auth func(*http.Request) (directory.BusPrincipal, bool)) {
	rec := serveCaptured(next, r)
	var local map[string]json.RawMessage
	if rec.overflow || rec.code() != http.StatusOK || json.Unmarshal(rec.body, &local) != nil {
		rec.copyTo(w)
		return
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(local["messages"], &msgs); err != nil {
		rec.copyTo(w)
		return
	}
	p, ok := auth(r)
	if !ok {
		rec.copyTo(w)
		return
	}
	limit := 0
	if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v > 0 {
		limit = v
	}
	for _, node := range n.others(r.Context()) {
		q := r.URL.Query()
		if limit > 0 {
			if len(msgs) >= limit {
				break
			}
			q.Set("limit", strconv.Itoa(limit-len(msgs)))
		}
		status, _, body, err := n.forward(r.Context(), r, node, p, q.Encode(), nil)
		if err != nil || status != http.StatusOK {
			n.lg.Warn("bus: poll another node", "node", node.NodeID, "status", status, "err", err)
			continue
		}
		var remote map[string]json.RawMessage
		var more []json.RawMessage
		if json.Unmarshal(body, &remote) != nil || json.Unmarshal(remote["messages"], &more) != nil {
			continue
		}
		msgs = append(msgs, more...)
		if _, ok := local["lease_id"]; !ok && len(more) > 0 {
			local["lease_id"], local["lease_expires_at"] = remote["lease_id"], remote["lease_expires_at"]
		}
	}
	if msgs == nil {
		msgs = []json.RawMessage{}
	}
	local["messages"], _ = json.Marshal(msgs)
	local["count"] = json.RawMessage(strconv.Itoa(len(msgs)))
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	out, _ := json.Marshal(local)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// firstKnown answers from this node, or, when it does not know the
// message (404), from the first other node that does.
func (n *Node) firstKnown(w http.ResponseWriter, r *http.Request, next http.Handler,
	auth func(*http.Request) (directory.BusPrincipal, bool)) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
	if err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "INVALID_BODY", "body too large or unreadable")
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := serveCaptured(next, r)
	if rec.overflow || rec.code() != http.StatusNotFound || !bytes.Contains(rec.body, []byte("MESSAGE_NOT_FOUND")) {
		rec.copyTo(w)
		return
	}
	p, ok := auth(r)
	if !ok {
		rec.copyTo(w)
		return
	}
	for _, node := range n.others(r.Context()) {
		status, hdr, rb, err := n.forward(r.Context(), r, node, p, r.URL.RawQuery, body)
		if err != nil || status == http.StatusNotFound {
			continue
		}
		writeAnswer(w, status, hdr, rb)
		return
	}
	rec.copyTo(w)
}
