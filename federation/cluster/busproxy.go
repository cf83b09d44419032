package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
)

// The bus across nodes, for consumers that poll: a message belongs to the
// node that accepted it, and a consumer may poll any node. Poll answers
// with this node's messages first and then asks the other live nodes over
// HTTP (the same request with the remaining limit), so leases are taken
// where the messages live; ack, lease renewal and message status go to
// this node and, when it does not know the message, to the others in turn.
//
// A forwarded request never carries the client's credentials. The
// forwarding node authenticated the client and sends, in headerCall, a
// token sealed with the cluster's key (seal.go) naming the receiving node
// (ID and URL), the request (method, path, query, body digest), the
// principal (the agent's Beam ID, or the operator) and a short expiry; the
// receiving node verifies it, drops any credentials the request carries,
// acts as that principal and answers locally only, so nothing is
// forwarded twice. Nodes are only those whose entries in the nodes bucket
// the cluster's key signed (nodes.go).

// headerCall carries a forwarding node's sealed token.
const headerCall = "X-Beam-Cluster-Call"

// forwardTimeout bounds one forwarded bus request.
const forwardTimeout = 5 * time.Second

// maxForwardBody bounds the body of a forwarded bus request.
const maxForwardBody = 1 << 20

// callTTL is how long a forwarded request's token is valid.
const callTTL = 30 * time.Second

// nodeCall is the payload of headerCall.
type nodeCall struct {
	To        string                 `json:"to"`  // the receiving node's ID
	URL       string                 `json:"url"` // the receiving node's base URL, as its entry announces it
	Method    string                 `json:"method"`
	Path      string                 `json:"path"`
	Query     string                 `json:"query"`
	Body      string                 `json:"body"` // hex SHA-256 of the body
	Principal directory.BusPrincipal `json:"principal"`
	Exp       int64                  `json:"exp"` // Unix seconds
}

func digest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// BusHandler wraps the directory's handler so that the bus's poll, ack,
// lease and message routes reach the messages of every node. auth tells
// who a client's credentials authenticate (bus.Bus.Principal).
func (n *Node) BusHandler(next http.Handler, auth func(*http.Request) (directory.BusPrincipal, bool)) http.Handler {
	client := &http.Client{Timeout: forwardTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		forwardable := r.Method == http.MethodPost && (r.URL.Path == "/v1/beam/ack" || r.URL.Path == "/v1/beam/lease") ||
			r.Method == http.MethodGet && (r.URL.Path == "/v1/beam/poll" || strings.HasPrefix(r.URL.Path, "/v1/beam/messages/"))
		switch {
		case r.Header.Get(headerCall) != "":
			n.serveCall(w, r, next, forwardable)
		case !forwardable:
			next.ServeHTTP(w, r)
		case r.URL.Path == "/v1/beam/poll":
			n.pollAll(w, r, next, client, auth)
		default:
			n.firstKnown(w, r, next, client, auth)
		}
	})
}

// serveCall answers a request another node forwarded, as the principal
// its token names, once the token proves the sender a member.
func (n *Node) serveCall(w http.ResponseWriter, r *http.Request, next http.Handler, forwardable bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
	if err != nil {
		httpjson.Error(w, http.StatusBadRequest, "INVALID_BODY", "body too large or unreadable")
		return
	}
	p, err := n.verifyCall(r, body)
	if err == nil && !forwardable {
		err = errors.New("not a route nodes forward")
	}
	if err != nil {
		n.refuse("call", err, "path", r.URL.Path)
		httpjson.Error(w, http.StatusUnauthorized, "UNAUTHORIZED", "cluster request not signed by a member")
		return
	}
	r.Header.Del("Authorization")
	r.Header.Del("X-Api-Key")
	r.Body = io.NopCloser(bytes.NewReader(body))
	next.ServeHTTP(w, r.WithContext(directory.WithBusPrincipal(r.Context(), p)))
}

// verifyCall checks r's headerCall token against r and this node and
// returns the principal it names.
func (n *Node) verifyCall(r *http.Request, body []byte) (directory.BusPrincipal, error) {
	from, payload, err := n.open(typNodeCall, []byte(r.Header.Get(headerCall)))
	if err != nil {
		return directory.BusPrincipal{}, err
	}
	var c nodeCall
	if err := json.Unmarshal(payload, &c); err != nil {
		return directory.BusPrincipal{}, fmt.Errorf("call from %s: %w", from, err)
	}
	now := time.Now()
	switch {
	case from == n.cfg.NodeID || c.To != n.cfg.NodeID || c.URL != n.url():
		return directory.BusPrincipal{}, fmt.Errorf("call from %s is for node %s at %q", from, c.To, c.URL)
	case c.Method != r.Method || c.Path != r.URL.Path || c.Query != r.URL.RawQuery || c.Body != digest(body):
		return directory.BusPrincipal{}, fmt.Errorf("call from %s is for another request", from)
	case c.Exp < now.Unix() || c.Exp > now.Add(2*callTTL).Unix():
		return directory.BusPrincipal{}, fmt.Errorf("call from %s expired or too far ahead", from)
	case !c.Principal.Valid():
		return directory.BusPrincipal{}, fmt.Errorf("call from %s names no principal", from)
	}
	return c.Principal, nil
}

// others returns the other live nodes that serve HTTP.
func (n *Node) others(ctx context.Context) []NodeInfo {
	nodes, err := n.Nodes(ctx)
	if err != nil {
		n.lg.Warn("bus: list nodes", "err", err)
		return nil
	}
	var out []NodeInfo
	for _, info := range nodes {
		if info.NodeID != n.cfg.NodeID && info.URL != "" {
			out = append(out, info)
		}
	}
	return out
}

// forward sends r (with body and query) to node as principal p and
// returns its answer.
func (n *Node) forward(ctx context.Context, client *http.Client, r *http.Request, node NodeInfo, p directory.BusPrincipal,
	query string, body []byte) (int, http.Header, []byte, error) {
	u := node.URL + r.URL.Path
	if query != "" {
		u += "?" + query
	}
	tok, err := n.seal(typNodeCall, nodeCall{To: node.NodeID, URL: node.URL, Method: r.Method, Path: r.URL.Path,
		Query: query, Body: digest(body), Principal: p, Exp: time.Now().Add(callTTL).Unix()})
	if err != nil {
		return 0, nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if v := r.Header.Get("Content-Type"); v != "" {
		req.Header.Set("Content-Type", v)
	}
	req.Header.Set(headerCall, tok)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCapturedBody))
	return resp.StatusCode, resp.Header, b, err
}

// pollAll answers a poll with this node's messages and then the other
// nodes', up to the limit.
func (n *Node) pollAll(w http.ResponseWriter, r *http.Request, next http.Handler, client *http.Client,
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
		status, _, body, err := n.forward(r.Context(), client, r, node, p, q.Encode(), nil)
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
func (n *Node) firstKnown(w http.ResponseWriter, r *http.Request, next http.Handler, client *http.Client,
	auth func(*http.Request) (directory.BusPrincipal, bool)) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
	if err != nil {
		httpjson.Error(w, http.StatusBadRequest, "INVALID_BODY", "body too large or unreadable")
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
		status, hdr, rb, err := n.forward(r.Context(), client, r, node, p, r.URL.RawQuery, body)
		if err != nil || status == http.StatusNotFound {
			continue
		}
		for k, v := range hdr {
			if k != "Content-Length" {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(status)
		_, _ = w.Write(rb)
		return
	}
	rec.copyTo(w)
}
