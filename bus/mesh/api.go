package mesh

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

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/sse"
	"github.com/beamdir/beam/tracing"
)

// keepaliveInterval is how often an idle event stream gets a comment.
var keepaliveInterval = 15 * time.Second

// Routes mounts the gateway under /api/v1/mesh.
func (e *Engine) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/mesh", e.api(e.handleCreate))
	mux.HandleFunc("POST /api/v1/mesh/{$}", e.api(e.handleCreate))
	mux.HandleFunc("GET /api/v1/mesh", e.api(e.handleList))
	mux.HandleFunc("GET /api/v1/mesh/{$}", e.api(e.handleList))
	mux.HandleFunc("GET /api/v1/mesh/dead-letters", e.api(e.handleDead))
	mux.HandleFunc("GET /api/v1/mesh/{id}", e.api(e.handleGet))
	mux.HandleFunc("GET /api/v1/mesh/{id}/trace", e.api(e.handleTrace))
	mux.HandleFunc("DELETE /api/v1/mesh/{id}", e.api(e.handleCancel))
	mux.HandleFunc("POST /api/v1/mesh/{id}/cancel", e.api(e.handleCancel))
	mux.HandleFunc("POST /api/v1/mesh/{id}/pause", e.api(e.handlePause))
	mux.HandleFunc("POST /api/v1/mesh/{id}/resume", e.api(e.handleResume))
	mux.HandleFunc("POST /api/v1/mesh/{id}/requeue", e.api(e.handleRequeue))
	mux.HandleFunc("POST /api/v1/mesh/{id}/fly", e.api(e.handleFly))
	mux.HandleFunc("POST /api/v1/mesh/{id}/processing", e.api(e.handleProcessing))
	mux.HandleFunc("GET /api/v1/mesh/{id}/events", e.api(e.handleEvents))
}

// api adapts a handler that returns an error (httpjson.Adapter): an
// *httpjson.Error is answered in the Beam error shape, anything else as 500.
func (e *Engine) api(h httpjson.HandlerFunc) http.HandlerFunc {
	return httpjson.Adapter{Log: e.lg}.Handler(h)
}

// principal is who a request acts as: an agent (by its API key) or the
// operator.
type principal struct {
	agent    string
	operator bool
}

// authenticate reads the operator token or an agent's API key (x-api-key,
// or Authorization: Bearer bk_…), or a signed request. A request another
// node of the cluster authenticated carries its principal instead
// (directory.WithBusPrincipal, set only by the cluster's handler).
func (e *Engine) authenticate(r *http.Request) (principal, error) {
	if p, ok := directory.BusPrincipalFrom(r.Context()); ok {
		switch {
		case p.Trusted && p.Via == viaOperator:
			return principal{operator: true}, nil
		case !p.Trusted && p.Agent != "":
			return principal{agent: p.Agent}, nil
		}
		return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "not a gateway principal")
	}
	if e.cfg.OperatorAuth != nil && e.cfg.OperatorAuth(r) {
		return principal{operator: true}, nil
	}
	key, ok := httpjson.APIKey(r)
	if !ok {
		if tok, ok := httpjson.Bearer(r); ok && strings.HasPrefix(tok, "bk_") {
			key = tok
		}
	}
	if key != "" {
		if a, ok := e.reg.AuthenticateAPIKey(key); ok {
			return principal{agent: a.BeamID}, nil
		}
		return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "invalid API key")
	}
	if _, ok := httpjson.Bearer(r); ok {
		return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "invalid token")
	}
	if r.Header.Get(wire.HeaderSignature) != "" {
		return e.authenticateSigned(r)
	}
	return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized,
		"send the creating agent's API key (x-api-key), its signature (x-beam-id, x-beam-timestamp, x-beam-nonce, x-beam-signature) or the operator token")
}

// viaOperator is the BusPrincipal.Via of the operator.
const viaOperator = "operator"

// Principal returns who r's credentials authenticate, for a node of a
// cluster that serves the request as that principal and forwards it to
// the other nodes (directory.WithBusPrincipal): the operator, or an agent
// by its API key or its signed request (whose nonce this takes). False
// when they authenticate no one.
func (e *Engine) Principal(r *http.Request) (directory.BusPrincipal, bool) {
	p, err := e.authenticate(r)
	switch {
	case err != nil:
		return directory.BusPrincipal{}, false
	case p.operator:
		return directory.BusPrincipal{Trusted: true, Via: viaOperator}, true
	}
	return directory.BusPrincipal{Agent: p.agent, Via: directory.BusAuthAPIKey}, true
}

// signedAction is the action of the object a signed gateway request signs.
const signedAction = "mesh.request"

// authenticateSigned checks a request signed by an agent: an Ed25519
// signature by its current key over the canonical JSON of
//
//	{"action":"mesh.request","beamId","method","path","bodySha256","timestamp","nonce"}
//
// (path with its query, bodySha256 the hex SHA-256 of the body), a
// timestamp within ±5 minutes and a nonce not used before, all checked and
// recorded by the registry as for its own signed mutations. The body is
// read here (bounded) and put back for the handler.
func (e *Engine) authenticateSigned(r *http.Request) (principal, error) {
	limit := int64(e.cfg.MaxPayloadBytes + 64<<10)
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return principal{}, httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "could not read the request body")
	}
	if int64(len(body)) > limit {
		return principal{}, httpjson.Errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body exceeds %d bytes", limit)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	sum := sha256.Sum256(body)
	a, err := e.reg.VerifySignedRequest(r.Context(), registry.SignedRequest{
		BeamID: r.Header.Get(wire.HeaderBeamID),
		Fields: map[string]any{"action": signedAction, "method": r.Method, "path": r.URL.RequestURI(),
			"bodySha256": hex.EncodeToString(sum[:])},
		Timestamp: r.Header.Get(wire.HeaderTimestamp), Nonce: r.Header.Get(wire.HeaderNonce), Signature: r.Header.Get(wire.HeaderSignature),
	})
	if err != nil {
		var he *httpjson.Error
		if errors.As(err, &he) {
			return principal{}, httpjson.Errorf(he.Status, he.Code, "signed request refused: %s: %s", he.Code, he.Message)
		}
		return principal{}, fmt.Errorf("verify signed request: %w", err)
	}
	return principal{agent: a.BeamID}, nil
}

// requested authenticates r and returns the envelope its {id} names, if
// the caller may see it.
func (e *Engine) requested(r *http.Request) (tracing.MeshRow, error) {
	p, err := e.authenticate(r)
	if err != nil {
		return tracing.MeshRow{}, err
	}
	return e.visible(r.Context(), p, r.PathValue("id"))
}

// visible returns envelope id if p may see it; others' envelopes are "not
// found", so that an agent never learns whether they exist.
func (e *Engine) visible(ctx context.Context, p principal, id string) (tracing.MeshRow, error) {
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil {
		return row, err
	}
	if !ok || (!p.operator && row.Creator != p.agent) {
		return tracing.MeshRow{}, httpjson.Errorf(http.StatusNotFound, codeNotFound, "no envelope %s", id)
	}
	return row, nil
}

// envelopeView is the JSON of an envelope for clients.
type envelopeView struct {
	tracing.MeshRow
	// Envelope is the decoded envelope with the row's status, or the
	// stored bytes when they do not decode. The struct itself is encoded
	// (the same bytes as encodeEnvelope, compacted by the caller's
	// encoder), so a view is not encoded and compacted twice.
	Envelope any `json:"envelope"`
}

func view(row tracing.MeshRow) envelopeView {
	if e, err := envelopeOf(row); err == nil {
		return envelopeView{MeshRow: row, Envelope: e}
	}
	return envelopeView{MeshRow: row, Envelope: json.RawMessage(row.Envelope)}
}

// createBody is the body of POST /api/v1/mesh.
type createBody struct {
	Route   json.RawMessage   `json:"route"`
	Payload json.RawMessage   `json:"payload"`
	Headers map[string]string `json:"headers"`
	Timeout json.RawMessage   `json:"timeout"`
	Creator string            `json:"creator"`
}

func (e *Engine) readJSON(w http.ResponseWriter, r *http.Request, v any, limit int) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return httpjson.Errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body exceeds %d bytes", limit)
		}
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "could not read the request body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, v); err != nil {
		ie := bodyJSONErr(err)
		ie.Err = err
		return ie
	}
	return nil
}

// bodyJSONErr describes a body json.Unmarshal refused in the client's
// terms: where the syntax breaks or which member has the wrong kind of
// value, never encoding/json's text, which names the server's Go types.
func bodyJSONErr(err error) *httpjson.Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "request body is not valid JSON (at byte %d)", syn.Offset)
	case errors.As(err, &typ) && typ.Field != "":
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "request body: %q holds a JSON %s where another kind of value belongs", typ.Field, typ.Value)
	default:
		return httpjson.New(http.StatusBadRequest, codeInvalidJSON, "request body must be a JSON object")
	}
}

// openRetryAfter is the Retry-After of a creation refused for too many
// open envelopes: a guess, since only their actors can finish them.
const openRetryAfter = 5 * time.Second

// CreateLimited is Create for an agent's own request (the gateway, A2A,
// MCP): within its creation rate (AllowCreate) and its cap of open
// envelopes (MaxOpenPerCreator), else a 429 *httpjson.Error with Retry-After.
func (e *Engine) CreateLimited(ctx context.Context, req CreateRequest) (tracing.MeshRow, error) {
	if e.cfg.AllowCreate != nil {
		if ok, wait := e.cfg.AllowCreate(req.Creator); !ok {
			ie := httpjson.Errorf(http.StatusTooManyRequests, codeRateLimited, "too many envelopes created by %s; retry later", req.Creator)
			ie.RetryAfter = wait
			return tracing.MeshRow{}, ie
		}
	}
	if e.cfg.MaxOpenPerCreator <= 0 {
		return e.Create(ctx, req)
	}
	// One creator's check and creation at a time, so that racing requests
	// cannot pass the check together.
	unlock := e.creates.Lock(req.Creator)
	defer unlock()
	n, err := e.log.MeshOpenCount(ctx, req.Creator, e.cfg.MaxOpenPerCreator)
	if err != nil {
		return tracing.MeshRow{}, err
	}
	if n >= e.cfg.MaxOpenPerCreator {
		ie := httpjson.Errorf(http.StatusTooManyRequests, codeTooManyOpen,
			"%s has %d open envelopes, the most one creator may have; retry when some have finished", req.Creator, n)
		ie.RetryAfter = openRetryAfter
		return tracing.MeshRow{}, ie
	}
	return e.Create(ctx, req)
}

// parseRoute reads a route as a list of actors, or as {curr, next}.
func parseRoute(raw json.RawMessage, actor string) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		if actor != "" {
			return []string{actor}, nil
		}
		return nil, httpjson.Errorf(http.StatusBadRequest, codeEmptyRoute, "route is required")
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var obj struct {
		Curr string   `json:"curr"`
		Next []string `json:"next"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "route must be a list of actors or {curr, next}")
	}
	var out []string
	if obj.Curr != "" {
		out = append(out, obj.Curr)
	}
	return append(out, obj.Next...), nil
}

// parseTimeout reads seconds (a number) or a Go duration string.
func parseTimeout(raw json.RawMessage) (time.Duration, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return 0, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "timeout %q: want a positive duration (\"30s\") or seconds", s)
		}
		return d, nil
	}
	var secs float64
	if err := json.Unmarshal(raw, &secs); err != nil || secs <= 0 || secs > 1e7 {
		return 0, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "timeout: want a positive number of seconds or a duration string")
	}
	return time.Duration(secs * float64(time.Second)), nil
}

func (e *Engine) handleCreate(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	var b createBody
	if err := e.readJSON(w, r, &b, e.cfg.MaxPayloadBytes+64<<10); err != nil {
		return err
	}
	route, err := parseRoute(b.Route, r.URL.Query().Get("actor"))
	if err != nil {
		return err
	}
	timeout, err := parseTimeout(b.Timeout)
	if err != nil {
		return err
	}
	creator := p.agent
	if p.operator {
		if b.Creator == "" {
			return httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "an operator creates an envelope on behalf of an agent: set creator")
		}
		creator = b.Creator
	} else if b.Creator != "" && b.Creator != p.agent {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "an agent creates envelopes only as itself")
	}
	req := CreateRequest{Creator: creator, Route: route, Payload: b.Payload, Headers: b.Headers, Timeout: timeout}
	var row tracing.MeshRow
	if p.operator {
		row, err = e.Create(r.Context(), req)
	} else {
		row, err = e.CreateLimited(r.Context(), req)
	}
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/v1/mesh/"+row.ID)
	httpjson.Write(w, http.StatusCreated, map[string]any{"id": row.ID, "status": row.Status})
	return nil
}

func (e *Engine) listQuery(r *http.Request, p principal) (tracing.MeshQuery, error) {
	q := tracing.MeshQuery{Creator: p.agent, ParentID: r.URL.Query().Get("parent")}
	if p.operator {
		q.Creator = r.URL.Query().Get("creator")
	}
	if s := r.URL.Query().Get("status"); s != "" {
		for _, part := range strings.Split(s, ",") {
			st := tracing.MeshStatus(strings.TrimSpace(part))
			if st.Order() < 0 {
				return q, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "unknown status %q", part)
			}
			q.Statuses = append(q.Statuses, st)
		}
	}
	for _, f := range []struct {
		name string
		dst  *int
		max  int
	}{{"limit", &q.Limit, 500}, {"offset", &q.Offset, 1 << 30}} {
		if v := r.URL.Query().Get(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > f.max {
				return q, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "%s must be an integer from 0 to %d", f.name, f.max)
			}
			*f.dst = n
		}
	}
	return q, nil
}

func (e *Engine) writeList(w http.ResponseWriter, r *http.Request, q tracing.MeshQuery) error {
	rows, total, err := e.log.MeshEnvelopes(r.Context(), q)
	if err != nil {
		return err
	}
	out := make([]envelopeView, len(rows))
	for i, row := range rows {
		out[i] = view(row)
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"messages": out, "total": total})
	return nil
}

func (e *Engine) handleList(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	q, err := e.listQuery(r, p)
	if err != nil {
		return err
	}
	return e.writeList(w, r, q)
}

func (e *Engine) handleDead(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	q, err := e.listQuery(r, p)
	if err != nil {
		return err
	}
	q.Sump = true
	return e.writeList(w, r, q)
}

func (e *Engine) handleGet(w http.ResponseWriter, r *http.Request) error {
	row, err := e.requested(r)
	if err != nil {
		return err
	}
	httpjson.Write(w, http.StatusOK, view(row))
	return nil
}

func (e *Engine) handleTrace(w http.ResponseWriter, r *http.Request) error {
	row, err := e.requested(r)
	if err != nil {
		return err
	}
	events, err := e.log.Trace(r.Context(), row.Nonce)
	if err != nil {
		return err
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"id": row.ID, "events": events})
	return nil
}

func (e *Engine) handleCancel(w http.ResponseWriter, r *http.Request) error {
	return e.control(w, r, e.Cancel)
}

func (e *Engine) handlePause(w http.ResponseWriter, r *http.Request) error {
	return e.control(w, r, e.Pause)
}

func (e *Engine) handleResume(w http.ResponseWriter, r *http.Request) error {
	return e.control(w, r, e.Resume)
}

// control runs a creator's (or the operator's) action on an envelope.
func (e *Engine) control(w http.ResponseWriter, r *http.Request, fn func(context.Context, string) (tracing.MeshRow, error)) error {
	row, err := e.requested(r)
	if err != nil {
		return err
	}
	out, err := fn(r.Context(), row.ID)
	if err != nil {
		return err
	}
	httpjson.Write(w, http.StatusOK, view(out))
	return nil
}

func (e *Engine) handleRequeue(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	if !p.operator {
		if _, err := e.visible(r.Context(), p, r.PathValue("id")); err != nil {
			return err
		}
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "requeue needs the operator token")
	}
	row, err := e.Requeue(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	httpjson.Write(w, http.StatusCreated, map[string]any{"id": row.ID, "parentId": row.ParentID, "status": row.Status})
	return nil
}

// handleFly takes an ephemeral FLY event from the envelope's current actor
// (or its creator, or the operator) and streams it to subscribers. It is
// never stored.
func (e *Engine) handleFly(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	row, ok, err := e.log.MeshEnvelope(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if !ok || !(p.operator || p.agent == row.Creator || p.agent == row.Actor) {
		return httpjson.Errorf(http.StatusNotFound, codeNotFound, "no envelope %s", r.PathValue("id"))
	}
	var b struct {
		Data json.RawMessage `json:"data"`
	}
	if err := e.readJSON(w, r, &b, 64<<10); err != nil {
		return err
	}
	if len(b.Data) == 0 {
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "data is required")
	}
	if row.Status.Terminal() {
		return httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s already %s", row.ID, row.Status)
	}
	n := 0
	if !statusOff(row) {
		n = e.hub.fly(row.ID, b.Data)
	}
	httpjson.Write(w, http.StatusAccepted, map[string]any{"subscribers": n})
	return nil
}

// handleProcessing takes the report of the envelope's current actor that
// it started processing attempt {"attempt": n} of its hop (the seed's
// "processing" point: progress only, recorded in the log).
func (e *Engine) handleProcessing(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	var b struct {
		Attempt int `json:"attempt"`
	}
	if err := e.readJSON(w, r, &b, 4<<10); err != nil {
		return err
	}
	if p.operator {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "only the hop's actor reports processing")
	}
	row, err := e.Processing(r.Context(), r.PathValue("id"), p.agent, b.Attempt)
	if err != nil {
		return err
	}
	httpjson.Write(w, http.StatusAccepted, map[string]any{"id": row.ID, "progress": row.Progress})
	return nil
}

// statusOff reports whether the envelope suppresses live status reporting
// (x-asya-mesh-status: off): no progress, no FLY events and no status but
// the terminal one reach its live subscribers (SSE, A2A streams and push
// notifications, MCP progress); GET still reads its state.
func statusOff(row tracing.MeshRow) bool {
	env, err := envelopes.decode(row.Envelope)
	return err == nil && strings.EqualFold(env.Headers[headerMeshStatus], "off")
}

// handleEvents streams an envelope's events as SSE: the current state
// first (or, with Last-Event-ID, every status change after that event,
// replayed from the log), then live status, progress and fly events; a
// keepalive comment every keepaliveInterval; closed on a terminal status.
// Event ids are log sequence numbers; FLY events carry none.
func (e *Engine) handleEvents(w http.ResponseWriter, r *http.Request) error {
	p, err := e.authenticate(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := e.visible(r.Context(), p, id); err != nil {
		return err
	}
	var after int64 = -1
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return httpjson.New(http.StatusBadRequest, codeInvalidField, "Last-Event-ID must be a non-negative integer")
		}
		after = n
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		return httpjson.New(http.StatusInternalServerError, httpjson.CodeInternal, "streaming unsupported")
	}
	sub := e.hub.subscribe(id)
	defer e.hub.unsubscribe(id, sub)
	row, _, err := e.log.MeshEnvelope(r.Context(), id)
	if err != nil {
		return err
	}
	sse.Open(w, "no-cache")

	off := statusOff(row)
	s := &sseWriter{Writer: sse.NewWriter(w), lastSeq: -1, noProgress: off}
	if after >= 0 {
		events, err := e.log.Trace(r.Context(), row.Nonce)
		if err != nil {
			return nil
		}
		var folded tracing.MeshRow
		for _, ev := range events {
			folded.Apply(ev)
			if ev.Seq > after {
				s.status(folded)
			}
		}
		s.lastSeq = max(s.lastSeq, after)
	} else {
		s.status(row)
	}
	if lr, ok := e.hub.liveProgress(id); ok && !off && lr.LastSeq == s.lastSeq && lr.Progress > s.progress {
		// Opened while the actor works: start from its live report.
		s.progress = lr.Progress
		s.Event("progress", "", appendProgress(nil, lr))
	}
	flusher.Flush()
	if row.Status.Terminal() || s.Err() != nil {
		return nil
	}
	keep := time.NewTicker(keepaliveInterval)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-sub.done:
			// Closed: the server stops, or this stream fell behind and
			// resumes from Last-Event-ID.
			return nil
		case <-keep.C:
			s.Comment("keepalive")
		case ev := <-sub.ch:
			if ev.fly != nil {
				if !off {
					s.Event("fly", "", ev.fly)
				}
			} else if ev.progress {
				if !off && ev.row.LastSeq == s.lastSeq && ev.row.Progress > s.progress {
					s.progress = ev.row.Progress
					s.Event("progress", "", appendProgress(nil, *ev.row))
				}
			} else if ev.row.LastSeq > s.lastSeq && (!off || ev.row.Status.Terminal()) {
				s.status(*ev.row)
			}
			if ev.row != nil && ev.row.Status.Terminal() && ev.row.LastSeq >= s.lastSeq {
				flusher.Flush()
				return nil
			}
		}
		if s.Err() != nil {
			return nil
		}
		flusher.Flush()
	}
}

// sseWriter writes an envelope's events, remembering what it has sent.
type sseWriter struct {
	*sse.Writer
	lastSeq  int64
	progress float64
	// noProgress leaves progress events out (status reporting off).
	noProgress bool
	opened     bool   // a status event was written
	data       []byte // a status event's data, reused
}

// status writes a status event (and a progress event when progress grew).
func (s *sseWriter) status(row tracing.MeshRow) {
	id := strconv.FormatInt(row.LastSeq, 10)
	data, err := appendView(s.data[:0], row)
	if err != nil {
		s.Fail(fmt.Errorf("encode status: %w", err))
		return
	}
	s.data = data
	// A stream opens with the envelope's status row, which carries its
	// progress; after that a change's progress comes before its row, so a
	// terminal row is the stream's last event.
	if row.Progress > s.progress && !s.noProgress {
		s.progress = row.Progress
		if s.opened {
			s.Event("progress", id, appendProgress(nil, row))
		}
	}
	s.Event("status", id, data)
	s.opened = true
	s.lastSeq = row.LastSeq
}
