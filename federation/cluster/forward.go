package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/beamdir/beam/internal/httpjson"
)

// The job bus across nodes: the Intent Protocol job bus runs at its home
// (homes.go), and every other node sends each request its job bus listener
// receives to the home over the cluster's NATS, on the home's jobs
// subject, and writes the home's answer back. Unlike a bus call
// (busproxy.go) a jobs call carries the client's credentials: the home
// authenticates the request itself, so tester keys, signed-request nonces,
// idempotency keys, rate limits and quotas are the home's, one decision
// for the whole cluster. The forwarding node sends the body as the data,
// the headers the job bus reads (jobsHeaders) as a JSON object in
// headerJobsHeaders, and, in headerSeal, a token sealed with the
// cluster's key naming a random call ID (taken once), the home, the
// request (method, path, query, the SHA-256 of the body and of the
// headers' JSON), the client's address and whether it came over TLS, the
// issue time and a short expiry. The home verifies it, rebuilds the
// request from the call and serves it through the job bus's own handler;
// the answer comes back in chunks, the last one sealed (busproxy.go).

// typJobsCall is the typ of a jobs call's token.
const typJobsCall = "beam-cluster-jobs-call+jws"

// headerJobsHeaders carries a jobs call's forwarded request headers.
const headerJobsHeaders = "Beam-Jobs-Headers"

// jobsTimeout bounds one forwarded job bus request. The job bus answers a
// client's request within its own write wait (4 s) and has no long poll
// (a claim with nothing to claim answers 204 at once); admin routes that
// walk the store get the rest.
const jobsTimeout = 30 * time.Second

// maxJobsBody bounds the body a node forwards (the job bus itself takes
// at most 8 KiB and answers larger bodies 413 in its own words).
const maxJobsBody = 64 << 10

// maxJobsServed bounds the jobs calls a home answers at once.
const maxJobsServed = 512

// homeRetryAfter is the Retry-After of a request while the home is down.
const homeRetryAfter = 5 * time.Second

// jobsHeaders are the request headers the job bus reads
// (bus/jobs/auth.go, http.go): credentials, signatures, idempotency,
// worker identity, the body's type and the proxy headers it trusts when
// configured to.
var jobsHeaders = []string{
	"Authorization", "X-Api-Key", "X-Admin-Token",
	"X-Signature", "X-Timestamp", "X-Nonce",
	"Idempotency-Key", "Content-Type",
	"X-Worker-Id", "X-Worker-Capabilities", "X-Worker-Capability",
	"X-Forwarded-Proto", "X-Forwarded-For",
}

// jobsCall is the payload of a jobs call's token.
type jobsCall struct {
	ID      string `json:"jti"` // random; taken once
	To      string `json:"to"`  // the home's node ID
	Method  string `json:"method"`
	Path    string `json:"path"`
	Query   string `json:"query"`
	Body    string `json:"body"`    // hex SHA-256 of the body
	Headers string `json:"headers"` // hex SHA-256 of headerJobsHeaders
	Remote  string `json:"remote"`  // the client's address
	TLS     bool   `json:"tls"`     // the client came over TLS
	Iat     int64  `json:"iat"`     // Unix seconds
	Exp     int64  `json:"exp"`     // Unix seconds
}

// jobsServer is what a node serving the job bus answers calls with.
type jobsServer struct {
	next    http.Handler
	problem func(http.ResponseWriter, *httpjson.Error)
}

func (n *Node) jobsSubject(nodeID string) string {
	return "beam.cluster." + Token(n.cfg.Domain) + ".node." + nodeID + ".jobs"
}

// JobsHandler wraps the job bus's handler (the whole listener): at the
// home it serves requests itself and answers the other nodes' calls; on
// any other node it forwards every request to the home. problem writes an
// error in the Intent Protocol's shape.
func (n *Node) JobsHandler(next http.Handler, problem func(http.ResponseWriter, *httpjson.Error)) http.Handler {
	n.jobs.Store(&jobsServer{next: next, problem: problem})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(headerCall) != "" {
			n.refuse("jobs call", errors.New("a node call over HTTP"), "path", r.URL.Path)
			problem(w, httpjson.New(http.StatusUnauthorized, "unauthorized", "Nodes call each other over the cluster's NATS, not HTTP."))
			return
		}
		if n.isHome(homeJobs) {
			next.ServeHTTP(w, r)
			return
		}
		home, ok := n.home(homeJobs)
		if !ok || home == n.cfg.NodeID || !n.isLive(home) {
			// Perhaps a takeover moved it and the watch has not told yet.
			n.refreshHome(r.Context(), homeJobs)
			if n.isHome(homeJobs) {
				next.ServeHTTP(w, r)
				return
			}
			home, ok = n.home(homeJobs)
		}
		if !ok || home == n.cfg.NodeID || !n.isLive(home) {
			problem(w, homeDown())
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJobsBody))
		if err != nil {
			problem(w, httpjson.New(http.StatusRequestEntityTooLarge, "body_too_large", "Request body exceeds the 8KB limit."))
			return
		}
		status, hdr, out, err := n.forwardJobs(r.Context(), r, home, body)
		if err != nil {
			n.lg.Warn("jobs: forward to the home", "home", home, "err", err)
			problem(w, homeDown())
			return
		}
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write(out)
	})
}

// homeDown is the answer while the job bus's home cannot be reached.
func homeDown() *httpjson.Error {
	return &httpjson.Error{Status: http.StatusServiceUnavailable, Code: "home_unavailable",
		Message: "The node serving the job bus is unavailable; retry.", RetryAfter: homeRetryAfter}
}

// forwardedHeaders is the JSON of r's headers the job bus reads.
func forwardedHeaders(r *http.Request) ([]byte, error) {
	h := map[string][]string{}
	for _, k := range jobsHeaders {
		if v := r.Header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	return b, nil
}

// forwardJobs sends r (with body) to the home and returns its answer.
func (n *Node) forwardJobs(ctx context.Context, r *http.Request, home string, body []byte) (int, http.Header, []byte, error) {
	hdrs, err := forwardedHeaders(r)
	if err != nil {
		return 0, nil, nil, err
	}
	if len(body)+len(hdrs) > int(n.nc.MaxPayload())-callRoom {
		return 0, nil, nil, fmt.Errorf("jobs call to %s: request does not fit a message", home)
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return 0, nil, nil, fmt.Errorf("jobs call to %s: %w", home, err)
	}
	now := time.Now()
	c := jobsCall{ID: hex.EncodeToString(id), To: home, Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
		Body: digest(body), Headers: digest(hdrs), Remote: r.RemoteAddr, TLS: r.TLS != nil,
		Iat: now.Unix(), Exp: now.Add(jobsTimeout + 5*time.Second).Unix()}
	tok, err := n.seal(typJobsCall, c)
	if err != nil {
		return 0, nil, nil, err
	}
	msg := &nats.Msg{Subject: n.jobsSubject(home), Data: body,
		Header: nats.Header{headerSeal: {tok}, headerJobsHeaders: {string(hdrs)}}}
	return n.call(ctx, msg, home, c.ID, jobsTimeout)
}

// onJobsCall answers a job bus request another node forwarded, once the
// token proves the sender a member, the call new and this node the home.
func (n *Node) onJobsCall(ctx context.Context, m *nats.Msg) {
	srv := n.jobs.Load()
	from, c, hdr, err := n.verifyJobsCall(m, time.Now())
	if err == nil && srv == nil {
		err = errors.New("this node serves no job bus")
	}
	if err != nil {
		n.refuse("jobs call", err, "path", c.Path)
		if srv != nil {
			n.answerProblem(m, from, c.ID, srv.problem, httpjson.New(http.StatusUnauthorized, "unauthorized", "Cluster request not signed by a member."))
		} else {
			n.answerErr(m, from, c.ID, httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "cluster request not signed by a member"))
		}
		return
	}
	if !n.isHome(homeJobs) {
		n.answerProblem(m, from, c.ID, srv.problem, homeDown())
		return
	}
	select {
	case n.jobsSlots <- struct{}{}:
	default:
		n.answerProblem(m, from, c.ID, srv.problem, &httpjson.Error{Status: http.StatusServiceUnavailable,
			Code: "busy", Message: "The bus is busy; retry.", RetryAfter: time.Second})
		return
	}
	go func() {
		defer func() { <-n.jobsSlots }()
		rctx, cancel := context.WithDeadline(ctx, time.Unix(c.Exp, 0))
		defer cancel()
		r, err := c.request(rctx, m.Data, hdr)
		if err != nil {
			n.answerProblem(m, from, c.ID, srv.problem, httpjson.New(http.StatusBadRequest, "invalid_request", "Bad request."))
			return
		}
		rec := serveCaptured(srv.next, r)
		if rec.overflow {
			n.answerProblem(m, from, c.ID, srv.problem, httpjson.New(http.StatusBadGateway, "too_large", "Answer too large."))
			return
		}
		n.answer(m, from, c.ID, rec.code(), rec.header, rec.body)
	}()
}

// request rebuilds the client's request from c, body and hdr as the home's
// own listener would have read it (callRequest).
func (c jobsCall) request(ctx context.Context, body []byte, hdr http.Header) (*http.Request, error) {
	r, err := callRequest(ctx, c.Method, c.Path, c.Query, body)
	if err != nil {
		return nil, fmt.Errorf("jobs call: %w", err)
	}
	r.RemoteAddr, r.Header = c.Remote, hdr
	if c.TLS {
		r.TLS = &tls.ConnectionState{}
	}
	return r, nil
}

// callRequest rebuilds a forwarded request from the client's escaped path
// and raw query as the answering node's own listener would have read
// them: the path is a request URI's, so one beginning "//" stays a path (a
// URL parser would take its first segment for a host), and an escaped "/",
// "?" or "#" in it stays part of its segment; every node routes it as the
// one that forwarded it.
func callRequest(ctx context.Context, method, path, query string, body []byte) (*http.Request, error) {
	u, uri, err := callURL(path, query)
	if err != nil {
		return nil, err
	}
	r, err := http.NewRequestWithContext(ctx, method, "/", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	r.URL, r.RequestURI = u, uri
	return r, nil
}

// callURL parses a forwarded request's escaped path and raw query as a
// request URI.
func callURL(path, query string) (*url.URL, string, error) {
	uri := path
	if query != "" {
		uri += "?" + query
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil || u.Path == "" || u.Path[0] != '/' {
		return nil, "", fmt.Errorf("request URI %q: not an absolute path", uri)
	}
	return u, uri, nil
}

// answerProblem answers a call with e in the job bus's shape.
func (n *Node) answerProblem(m *nats.Msg, to, call string, problem func(http.ResponseWriter, *httpjson.Error), e *httpjson.Error) {
	rec := newCaptured()
	problem(rec, e)
	n.answer(m, to, call, rec.code(), rec.header, rec.body)
}

// verifyJobsCall checks a jobs call's token against its body, headers and
// this node, and takes its ID; it returns the calling node, the call and
// the headers to serve it with.
func (n *Node) verifyJobsCall(m *nats.Msg, now time.Time) (string, jobsCall, http.Header, error) {
	var c jobsCall
	from, payload, err := n.open(typJobsCall, []byte(m.Header.Get(headerSeal)))
	if err != nil {
		return "", c, nil, err
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return from, c, nil, fmt.Errorf("jobs call from %s: %w", from, err)
	}
	raw := m.Header.Get(headerJobsHeaders)
	switch {
	case from == n.cfg.NodeID || c.To != n.cfg.NodeID:
		return from, c, nil, fmt.Errorf("jobs call from %s is for node %s", from, c.To)
	case c.Body != digest(m.Data) || c.Headers != digest([]byte(raw)):
		return from, c, nil, fmt.Errorf("jobs call from %s is for another request", from)
	case c.Exp < now.Unix() || c.Exp > now.Add(jobsTimeout+callTTL).Unix():
		return from, c, nil, fmt.Errorf("jobs call from %s expired or too far ahead", from)
	case c.Iat < n.started.Unix():
		return from, c, nil, fmt.Errorf("jobs call from %s issued before this node started", from)
	case len(c.ID) < 16:
		return from, c, nil, fmt.Errorf("jobs call from %s has no ID", from)
	}
	var fwd map[string][]string
	if err := json.Unmarshal([]byte(raw), &fwd); err != nil {
		return from, c, nil, fmt.Errorf("jobs call from %s: headers: %w", from, err)
	}
	hdr := http.Header{}
	for _, k := range jobsHeaders {
		for _, v := range fwd[k] {
			hdr.Add(k, v)
		}
	}
	if err := n.calls.take(c.ID, c.Exp, now); err != nil {
		return from, c, nil, fmt.Errorf("jobs call from %s: %w", from, err)
	}
	return from, c, hdr, nil
}
