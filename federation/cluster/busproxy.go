package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The bus across nodes, for consumers that poll: a message belongs to the
// node that accepted it, and a consumer may poll any node. Poll answers
// with this node's messages first and then asks the other live nodes over
// HTTP (the same request and credentials, with the remaining limit), so
// leases are taken where the messages live; ack, lease renewal and message
// status go to this node and, when it does not know the message, to the
// others in turn. A request one node forwarded is answered locally only
// (headerForwarded), so nothing is forwarded twice.

// headerForwarded marks a bus request another node of the cluster
// forwarded.
const headerForwarded = "X-Beam-Cluster-Forwarded"

// forwardTimeout bounds one forwarded bus request.
const forwardTimeout = 5 * time.Second

// maxForwardBody bounds the body of a forwarded bus request.
const maxForwardBody = 1 << 20

// BusHandler wraps the directory's handler so that the bus's poll, ack,
// lease and message routes reach the messages of every node.
func (n *Node) BusHandler(next http.Handler) http.Handler {
	client := &http.Client{Timeout: forwardTimeout}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(headerForwarded) != "" || !strings.HasPrefix(r.URL.Path, "/v1/beam/") {
			next.ServeHTTP(w, r)
			return
		}
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/beam/poll":
			n.pollAll(w, r, next, client)
		case r.Method == http.MethodPost && (r.URL.Path == "/v1/beam/ack" || r.URL.Path == "/v1/beam/lease"),
			r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/beam/messages/"):
			n.firstKnown(w, r, next, client)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// otherURLs returns the HTTP base URLs of the other live nodes.
func (n *Node) otherURLs(ctx context.Context) []string {
	nodes, err := n.Nodes(ctx)
	if err != nil {
		n.lg.Warn("bus: list nodes", "err", err)
		return nil
	}
	var out []string
	for _, info := range nodes {
		if info.NodeID != n.cfg.NodeID && info.URL != "" {
			out = append(out, info.URL)
		}
	}
	return out
}

// forward sends r (with body) to the node at base and returns its answer.
func forward(ctx context.Context, client *http.Client, r *http.Request, base string, query string, body []byte) (int, http.Header, []byte, error) {
	u := base + r.URL.Path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for _, h := range []string{"Authorization", "X-Api-Key", "Content-Type"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set(headerForwarded, "1")
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
func (n *Node) pollAll(w http.ResponseWriter, r *http.Request, next http.Handler, client *http.Client) {
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
	limit := 0
	if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v > 0 {
		limit = v
	}
	for _, base := range n.otherURLs(r.Context()) {
		q := r.URL.Query()
		if limit > 0 {
			if len(msgs) >= limit {
				break
			}
			q.Set("limit", strconv.Itoa(limit-len(msgs)))
		}
		status, _, body, err := forward(r.Context(), client, r, base, q.Encode(), nil)
		if err != nil || status != http.StatusOK {
			n.lg.Warn("bus: poll another node", "node", base, "status", status, "err", err)
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
func (n *Node) firstKnown(w http.ResponseWriter, r *http.Request, next http.Handler, client *http.Client) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
	if err != nil {
		http.Error(w, `{"error":"body too large or unreadable","errorCode":"INVALID_BODY"}`, http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := serveCaptured(next, r)
	if rec.overflow || rec.code() != http.StatusNotFound || !bytes.Contains(rec.body, []byte("MESSAGE_NOT_FOUND")) {
		rec.copyTo(w)
		return
	}
	for _, base := range n.otherURLs(r.Context()) {
		status, hdr, rb, err := forward(r.Context(), client, r, base, r.URL.RawQuery, body)
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
