package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// authKind says how a route authenticates.
type authKind int

const (
	authNone authKind = iota
	authKey
	authAdmin
	authMetrics
)

// route is one endpoint: a method and a path (exact, or a prefix followed
// by one parameter, optionally followed by a suffix).
type route struct {
	method, prefix, suffix string
	param                  bool
	auth                   authKind
	h                      func(s *Service, w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error
}

// call is what a handler gets besides the request.
type call struct {
	p     *principal
	param string
	body  []byte
	f     fields
}

var routes = []route{
	{method: "GET", prefix: "/health", h: (*Service).handleHealth},
	{method: "GET", prefix: "/metrics", auth: authMetrics, h: (*Service).handleMetrics},
	{method: "POST", prefix: "/intent", auth: authKey, h: (*Service).handlePublish},
	{method: "POST", prefix: "/claim", auth: authKey, h: (*Service).handleClaim},
	{method: "POST", prefix: "/extend_claim/", param: true, auth: authKey, h: (*Service).handleExtend},
	{method: "POST", prefix: "/fulfill/", param: true, auth: authKey, h: (*Service).handleFulfill},
	{method: "POST", prefix: "/fail/", param: true, auth: authKey, h: (*Service).handleFail},
	{method: "GET", prefix: "/result/", param: true, auth: authKey, h: (*Service).handleResult},
	{method: "GET", prefix: "/status/", param: true, auth: authKey, h: (*Service).handleStatus},
	{method: "POST", prefix: "/set/", param: true, auth: authKey, h: (*Service).handleSet},
	{method: "GET", prefix: "/get/", param: true, auth: authKey, h: (*Service).handleGet},
	{method: "GET", prefix: "/admin/dashboard", auth: authAdmin, h: (*Service).handleDashboard},
	{method: "POST", prefix: "/admin/generate_key", auth: authAdmin, h: (*Service).handleGenerateKey},
	{method: "POST", prefix: "/admin/revoke_key", auth: authAdmin, h: (*Service).handleRevokeKey},
	{method: "POST", prefix: "/admin/purge", auth: authAdmin, h: (*Service).handlePurge},
	{method: "POST", prefix: "/admin/cleanup", auth: authAdmin, h: (*Service).handleCleanup},
	{method: "POST", prefix: "/admin/intents/", suffix: "/cancel", param: true, auth: authAdmin, h: (*Service).handleCancel},
	{method: "POST", prefix: "/admin/intents/", suffix: "/retry", param: true, auth: authAdmin, h: (*Service).handleRetry},
	{method: "GET", prefix: "/admin/intents/", param: true, auth: authAdmin, h: (*Service).handleAdminIntent},
	{method: "GET", prefix: "/admin/dead", auth: authAdmin, h: (*Service).handleDeadList},
	{method: "GET", prefix: "/admin/dead/", param: true, auth: authAdmin, h: (*Service).handleDead},
}

// match finds the route of path: the parameter is what lies between
// prefix and suffix and must not be empty (nor contain "/" unless it is a
// KV key).
func match(rt *route, path string) (string, bool) {
	if !rt.param {
		return "", path == rt.prefix
	}
	if !strings.HasPrefix(path, rt.prefix) || !strings.HasSuffix(path, rt.suffix) ||
		len(path) < len(rt.prefix)+len(rt.suffix)+1 {
		return "", false
	}
	p := path[len(rt.prefix) : len(path)-len(rt.suffix)]
	kv := rt.prefix == "/set/" || rt.prefix == "/get/"
	if !kv && strings.Contains(p, "/") {
		return "", false
	}
	return p, true
}

// Handler returns the protocol's HTTP handler, paths at the root.
func (s *Service) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

func (s *Service) serveHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	api := httpjson.Adapter{Shape: problem, Log: s.lg, Fault: errInternal}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			api.WriteErr(w, r, fmt.Errorf("intent bus handler panic: %v", p))
		}
	}()
	nw := &nonceWriter{ResponseWriter: w, s: s}
	if e := s.dispatch(nw, r); e != nil {
		if e.Status == http.StatusUnauthorized && strings.HasPrefix(r.URL.Path, "/admin/") {
			w.Header().Set("WWW-Authenticate", `Basic realm="Intent Bus Admin"`)
		}
		api.WriteErr(nw, r, e)
	}
}

func (s *Service) dispatch(nw *nonceWriter, r *http.Request) *httpjson.Error {
	var w http.ResponseWriter = nw
	path := r.URL.Path
	var rt *route
	var param string
	var methods []string
	for i := range routes {
		p, ok := match(&routes[i], path)
		if !ok {
			continue
		}
		if routes[i].method == r.Method || (r.Method == http.MethodHead && routes[i].method == "GET") {
			rt, param = &routes[i], p
			break
		}
		methods = append(methods, routes[i].method)
	}
	if rt == nil {
		if len(methods) > 0 {
			w.Header().Set("Allow", strings.Join(methods, ", "))
			return httpjson.New(http.StatusMethodNotAllowed, "method_not_allowed", "Method "+r.Method+" is not allowed on "+path+".")
		}
		return httpjson.New(http.StatusNotFound, "not_found", "No such route: "+path+".")
	}
	c := &call{param: param}
	if rt.auth != authNone && s.cfg.EnforceHTTPS && !s.secure(r) {
		return httpjson.New(http.StatusForbidden, "https_required", "HTTPS is required.")
	}
	switch rt.auth {
	case authMetrics:
		if !s.metricsAuth(r) {
			return httpjson.New(http.StatusUnauthorized, "unauthorized", "Metrics need a bearer metrics token or admin credentials.")
		}
	case authAdmin:
		if !s.admin(r) {
			return httpjson.New(http.StatusUnauthorized, "unauthorized", "Admin authentication required.")
		}
	case authKey:
		if s.cfg.Maintenance {
			return &httpjson.Error{Status: http.StatusServiceUnavailable, Code: "maintenance",
				Message: "The bus is in maintenance mode.", RetryAfter: 60 * time.Second}
		}
	}
	if rt.auth == authKey || rt.auth == authAdmin {
		body, e := readBody(w, r)
		if e != nil {
			return e
		}
		c.body = body
	}
	if rt.auth == authKey {
		// A client's request waits at most writeWait for the log: a write
		// still queued then is dropped and answered 503 (retried by the
		// SDK) within the SDK's 10 s timeout.
		ctx, cancel := context.WithTimeout(r.Context(), writeWait)
		defer cancel()
		r = r.WithContext(ctx)
		p, e := s.authenticate(r, c.body)
		if e != nil {
			return e
		}
		if p.nonce != nil {
			r = r.WithContext(context.WithValue(r.Context(), nonceCtxKey{}, p.nonce))
			nw.ctx, nw.n = r.Context(), p.nonce
		}
		if wait := s.allow(p); wait > 0 {
			return &httpjson.Error{Status: http.StatusTooManyRequests, Code: "rate_limited",
				Message: fmt.Sprintf("Too many requests: %d per minute per key.", s.cfg.RateLimit), RetryAfter: time.Duration(wait) * time.Second}
		}
		c.p = p
	}
	if rt.method == "POST" {
		f, e := decodeObject(c.body)
		if e != nil {
			return e
		}
		c.f = f
	}
	return rt.h(s, w, r, c)
}

// writeWait bounds how long a client's request waits for the log to take
// its write (a lock another process holds on the database, a stalled
// disk). With the log's own 5 s busy timeout for a write in progress, a
// request is answered within the Python SDK's 10 s request timeout.
const writeWait = 4 * time.Second

// readBody reads at most maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *httpjson.Error) {
	if r.ContentLength > maxBody {
		return nil, httpjson.New(http.StatusRequestEntityTooLarge, "body_too_large", "Request body exceeds the 8KB limit.")
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, httpjson.New(http.StatusRequestEntityTooLarge, "body_too_large", "Request body exceeds the 8KB limit.")
		}
		return nil, httpjson.New(http.StatusBadRequest, "invalid_request", "Could not read the request body.")
	}
	return b, nil
}

// internal turns an unexpected error into a 503 (the log is busy or
// closing) without exposing its text.
func (s *Service) internal(err error) *httpjson.Error {
	s.lg.Error("intent bus", "err", err)
	return &httpjson.Error{Status: http.StatusServiceUnavailable, Code: "database_busy",
		Message: "The bus could not record the change; retry.", RetryAfter: time.Second}
}

func (s *Service) handleHealth(w http.ResponseWriter, _ *http.Request, _ *call) *httpjson.Error {
	reply(w, http.StatusOK, map[string]any{"ok": true, "ts": float64(s.clock().UnixMicro()) / 1e6, "version": "2.1"})
	return nil
}

func (s *Service) handlePublish(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	p, e := parsePublish(c.f)
	if e != nil {
		return e
	}
	idem := r.Header.Get("Idempotency-Key")
	if len(idem) > 256 {
		return invalid("idempotency_key", "Idempotency-Key must be at most 256 characters.")
	}
	var hash string
	if idem != "" {
		hash = canonicalHash(c.body)
	}
	status, body, err := s.publish(r.Context(), p, c.p, idem, hash)
	if err != nil {
		var ae *httpjson.Error
		if errors.As(err, &ae) {
			return ae
		}
		return s.internal(err)
	}
	writeRaw(w, status, body)
	return nil
}

type claimResp struct {
	ID                 string          `json:"id"`
	Namespace          string          `json:"namespace"`
	Goal               string          `json:"goal"`
	Payload            json.RawMessage `json:"payload"`
	ClaimAttempts      int             `json:"claim_attempts"`
	Priority           int             `json:"priority"`
	TargetWorker       *string         `json:"target_worker"`
	RequiredCapability *string         `json:"required_capability"`
	ClaimToken         string          `json:"claim_token"`
	ClaimTimeout       int             `json:"claim_timeout"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Service) handleClaim(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	q := r.URL.Query()
	f := &claimFilter{namespace: q.Get("namespace"), goal: q.Get("goal"), caller: c.p.digest}
	if f.namespace == "" {
		f.namespace = "default"
	}
	if !namespaceRe.MatchString(f.namespace) {
		return invalid("namespace", "namespace must be 1 to 64 characters of letters, digits, '.', '-' and '_'.")
	}
	if q.Has("goal") && (f.goal == "" || len([]rune(f.goal)) > 256) {
		return invalid("goal", "goal must be 1 to 256 characters.")
	}
	if pub := q.Get("publisher"); pub != "" {
		d := keyDigest(pub)
		if c.p.tester && d != c.p.digest {
			return httpjson.New(http.StatusForbidden, "forbidden", "publisher filtering is restricted to your own key.")
		}
		f.publisher = d
	}
	f.worker = r.Header.Get("X-Worker-ID")
	if f.worker == "" {
		f.worker = q.Get("worker_id")
	}
	if f.worker != "" && !workerRe.MatchString(f.worker) {
		return invalid("worker_id", "worker id must be 1 to 64 characters of letters, digits, '.', ':', '-' and '_'.")
	}
	caps := r.Header.Get("X-Worker-Capabilities")
	for _, alt := range []string{r.Header.Get("X-Worker-Capability"), q.Get("capabilities"), q.Get("capability")} {
		if caps == "" {
			caps = alt
		}
	}
	if len(caps) > 4096 {
		return invalid("capabilities", "capabilities list is too long.")
	}
	f.caps = splitCaps(caps)
	got, err := s.claim(r.Context(), f)
	if err != nil {
		return s.internal(err)
	}
	if got == nil {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	reply(w, http.StatusOK, claimResp{
		ID: got.row.ID, Namespace: got.row.Namespace, Goal: got.row.Goal, Payload: got.row.Payload,
		ClaimAttempts: got.row.ClaimAttempts, Priority: got.row.Priority,
		TargetWorker: nullable(got.row.TargetWorker), RequiredCapability: nullable(got.row.RequiredCapability),
		ClaimToken: got.token, ClaimTimeout: int(s.cfg.ClaimTimeout / time.Second),
	})
	return nil
}

var notOwned = httpjson.New(http.StatusNotFound, "not_found", "Intent not found, not owned by you, or invalid claim_token.")

func (s *Service) mutationErr(err error) *httpjson.Error {
	if errors.Is(err, errLeaseLost) {
		return notOwned
	}
	return s.internal(err)
}

func (s *Service) handleExtend(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	tok, e := claimToken(c.f)
	if e != nil {
		return e
	}
	secs, e := c.f.number("seconds", 60, 10, 3600)
	if e != nil {
		return e
	}
	if err := s.extend(r.Context(), c.param, c.p, tok, time.Duration(secs*float64(time.Second))); err != nil {
		return s.mutationErr(err)
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "id": c.param, "extended_by": secs})
	return nil
}

func (s *Service) handleFulfill(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	tok, e := claimToken(c.f)
	if e != nil {
		return e
	}
	rt, hasType, e := c.f.str("result_type")
	if e != nil {
		return invalid("result_type", `result_type must be "json" or "text".`)
	}
	if hasType && rt != "json" && rt != "text" {
		return invalid("result_type", `result_type must be "json" or "text".`)
	}
	if !hasType {
		rt = "json"
	}
	var result []byte
	if c.f.has("result") {
		if rt == "text" {
			if _, _, e := c.f.str("result"); e != nil {
				return invalid("result", "A text result must be a string.")
			}
		}
		if result, e = compactValue(c.f["result"], "result", "result_too_large"); e != nil {
			return e
		}
	} else {
		rt = ""
	}
	if err := s.fulfill(r.Context(), c.param, c.p, tok, result, rt); err != nil {
		return s.mutationErr(err)
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "id": c.param})
	return nil
}

func (s *Service) handleFail(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	tok, e := claimToken(c.f)
	if e != nil {
		return e
	}
	msg, ok, e := c.f.str("error")
	if e != nil {
		return e
	}
	if !ok || msg == "" {
		msg = "unknown"
	}
	if utf8Len := []rune(msg); len(utf8Len) > 500 {
		msg = string(utf8Len[:500])
	}
	if err := s.fail(r.Context(), c.param, c.p, tok, msg); err != nil {
		return s.mutationErr(err)
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "id": c.param})
	return nil
}

// visible returns the job row if c may read it (publisher, last claimer or
// the main key).
func (s *Service) visible(c *call) (tracing.JobRow, *httpjson.Error) {
	row, ok := s.view(c.param)
	if !ok {
		return row, httpjson.New(http.StatusNotFound, "not_found", "Intent not found.")
	}
	if c.p.tester && row.Publisher != c.p.digest && row.ClaimedBy != c.p.digest {
		return row, httpjson.New(http.StatusForbidden, "forbidden", "Only the publisher, the claimer or an admin may read this intent.")
	}
	return row, nil
}

func secsOrNil(ms int64) *float64 {
	if ms == 0 {
		return nil
	}
	v := msToSecs(ms)
	return &v
}

func statusView(row *tracing.JobRow) map[string]any {
	m := map[string]any{
		"id": row.ID, "namespace": row.Namespace, "goal": row.Goal, "status": row.Status,
		"priority": row.Priority, "visibility": row.Visibility, "claim_attempts": row.ClaimAttempts,
		"run_at": msToSecs(row.RunAt), "claim_expires_at": secsOrNil(row.ClaimExpiresAt),
		"target_worker": nullable(row.TargetWorker), "required_capability": nullable(row.RequiredCapability),
		"completed_at": secsOrNil(row.CompletedAt),
	}
	return m
}

func (s *Service) handleStatus(w http.ResponseWriter, _ *http.Request, c *call) *httpjson.Error {
	row, e := s.visible(c)
	if e != nil {
		return e
	}
	m := statusView(&row)
	m["last_error"] = nullable(row.LastError)
	reply(w, http.StatusOK, m)
	return nil
}

func (s *Service) handleResult(w http.ResponseWriter, _ *http.Request, c *call) *httpjson.Error {
	row, e := s.visible(c)
	if e != nil {
		return e
	}
	m := statusView(&row)
	m["result_type"] = "json"
	if row.ResultType != "" {
		m["result_type"] = row.ResultType
	}
	if row.Result != nil {
		m["result"] = json.RawMessage(row.Result)
	}
	if row.LastError != "" {
		m["error"] = row.LastError
	}
	reply(w, http.StatusOK, m)
	return nil
}

func (s *Service) handleSet(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	if len(c.param) > 256 {
		return invalid("key", "key must be at most 256 bytes.")
	}
	if !c.f.has("value") {
		return httpjson.New(http.StatusBadRequest, "invalid_request", "Missing value.")
	}
	val, e := compactValue(c.f["value"], "value", "value_too_large")
	if e != nil {
		return e
	}
	ttl, e := c.f.integer("ttl", 600, 1, 86400)
	if e != nil {
		return e
	}
	if err := s.set(r.Context(), c.p.digest, c.param, string(val), time.Duration(ttl)*time.Second); err != nil {
		return s.internal(err)
	}
	reply(w, http.StatusOK, map[string]any{"ok": true})
	return nil
}

func (s *Service) handleGet(w http.ResponseWriter, _ *http.Request, c *call) *httpjson.Error {
	v, ok := s.get(c.p.digest, c.param)
	if !ok {
		return httpjson.New(http.StatusNotFound, "not_found", "Key not found.")
	}
	writeRaw(w, http.StatusOK, []byte(`{"value":`+v+`}`))
	return nil
}

func (s *Service) metricsAuth(r *http.Request) bool {
	if s.cfg.MetricsToken != "" {
		if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") &&
			constEq(strings.TrimPrefix(h, "Bearer "), s.cfg.MetricsToken) {
			return true
		}
	}
	return s.admin(r)
}
