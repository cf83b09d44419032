package bus

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Error codes of the bus's HTTP API ({"error", "errorCode"} bodies).
const (
	CodeInvalidJSON       = "INVALID_JSON"
	CodeMissingFields     = "MISSING_REQUIRED_FIELDS"
	CodeInvalidPayload    = "INVALID_PAYLOAD"
	CodeNonceReuse        = "NONCE_REUSE_CONFLICT"
	CodeInProgress        = "IN_PROGRESS"
	CodeMessageNotFound   = "MESSAGE_NOT_FOUND"
	CodeMissingMessageID  = "MISSING_MESSAGE_ID"
	CodeInvalidState      = "INVALID_STATE"
	CodeInvalidStatus     = "INVALID_STATUS"
	CodeMissingAgent      = "MISSING_AGENT"
	CodeUnauthorized      = "UNAUTHORIZED"
	CodeForbidden         = "FORBIDDEN"
	CodePayloadTooLarge   = "PAYLOAD_TOO_LARGE"
	CodeInternal          = "INTERNAL_ERROR"
	CodeRateLimited       = "RATE_LIMITED"
	maxFieldBytes         = 256
	maxFilterBytes        = 1024
	defaultPollLimit      = 10
	maxPollLimit          = 100
	defaultHistoryLimit   = 50
	defaultDeadLimit      = 100
	maxListLimit          = 500
	signedFrameWindow     = directory.ReplayWindow
	reasonLeaseMismatch   = "LEASE_MISMATCH"
	reasonLeaseExpired    = "LEASE_EXPIRED"
	reasonWebSocketInFlux = "WEBSOCKET_ATTEMPT_IN_FLIGHT"
)

// apiError is an error answer of the HTTP API.
type apiError struct {
	status int
	code   string
	msg    string
	reason string
	// retryAfter, when set, is sent as Retry-After (RATE_LIMITED).
	retryAfter time.Duration
}

func errf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func (b *Bus) writeErr(w http.ResponseWriter, e *apiError) {
	body := map[string]any{"error": e.msg, "errorCode": e.code}
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(e.retryAfter.Seconds())))))
	}
	if e.reason != "" {
		body["reason"] = e.reason
	}
	writeJSON(w, e.status, body)
}

// internal logs an unexpected failure of what and returns the 500 the
// client gets.
func (b *Bus) internal(what string, err error) *apiError {
	b.lg.Error("bus: "+what, "err", err)
	return errf(http.StatusInternalServerError, CodeInternal, "%s failed", what)
}

// api adapts a handler that returns its error: a non-nil error is written
// in the Beam error shape.
func (b *Bus) api(h func(http.ResponseWriter, *http.Request) *apiError) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if aerr := h(w, r); aerr != nil {
			b.writeErr(w, aerr)
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }

// Routes registers the bus API under /v1/beam on mux.
func (b *Bus) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/beam/send", b.api(b.handleSend))
	mux.HandleFunc("GET /v1/beam/poll", b.api(b.handlePoll))
	mux.HandleFunc("POST /v1/beam/ack", b.api(b.handleAck))
	mux.HandleFunc("POST /v1/beam/lease", b.api(b.handleLease))
	mux.HandleFunc("GET /v1/beam/messages/{id}", b.api(b.handleMessage))
	mux.HandleFunc("GET /v1/beam/history", b.api(b.handleHistory))
	mux.HandleFunc("GET /v1/beam/stats", b.api(b.handleStats))
	mux.HandleFunc("GET /v1/beam/dead-letter", b.api(b.handleDeadLetters))
	mux.HandleFunc("POST /v1/beam/dead-letter/{id}/requeue", b.api(b.handleRequeue))
}

// principal is who a request acts as.
type principal struct {
	agent   string // the agent of an API key
	trusted bool   // the bus key or the operator token
	via     string
}

func (p principal) canActAs(beamID string) bool { return p.trusted || p.agent == beamID }

func bearer(r *http.Request) string {
	tok, _ := httpjson.Bearer(r)
	return tok
}

// authenticate resolves the request's credentials: the operator token, the
// bus key (Authorization: Bearer), or an agent's API key (x-api-key or
// Authorization: Bearer bk_…).
func (b *Bus) authenticate(r *http.Request) (principal, *apiError) {
	if b.cfg.OperatorAuth != nil && b.cfg.OperatorAuth(r) {
		return principal{trusted: true, via: "operator"}, nil
	}
	tok := bearer(r)
	if key := b.cfg.BusAPIKey; key != "" && tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(key)) == 1 {
		return principal{trusted: true, via: directory.BusAuthBusKey}, nil
	}
	key := r.Header.Get("X-Api-Key")
	if key == "" && strings.HasPrefix(tok, "bk_") {
		key = tok
	}
	if key != "" {
		if a, ok := b.reg.AuthenticateAPIKey(key); ok {
			return principal{agent: a.BeamID, via: directory.BusAuthAPIKey}, nil
		}
		return principal{}, errf(http.StatusUnauthorized, CodeUnauthorized, "Unauthorized: invalid API key")
	}
	if tok != "" {
		return principal{}, errf(http.StatusUnauthorized, CodeUnauthorized, "Unauthorized: invalid token")
	}
	return principal{}, errf(http.StatusUnauthorized, CodeUnauthorized,
		"Unauthorized: send the agent's API key (x-api-key), the bus key or a signed frame")
}

// readBody reads a bounded JSON object body.
func (b *Bus) readBody(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(b.cfg.MaxBodyBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errf(http.StatusRequestEntityTooLarge, CodePayloadTooLarge, "request body exceeds %d bytes", b.cfg.MaxBodyBytes)
		}
		return nil, errf(http.StatusBadRequest, CodeInvalidJSON, "could not read the request body")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return nil, errf(http.StatusBadRequest, CodeInvalidJSON, "request body must be a JSON object")
	}
	// encoding/json keeps the last of duplicated keys, other parsers the
	// first: a body (or a frame or payload in it) with one is refused, so
	// every reader sees the values the sender meant.
	var dup *wire.DuplicateKeyError
	if err := wire.CheckNoDuplicateKeys(body); errors.As(err, &dup) {
		return nil, errf(http.StatusBadRequest, CodeInvalidJSON, "request body has a %s", dup.Error())
	}
	return raw, nil
}

// authedBody reads a bounded JSON object body, then authenticates the
// request; the body's error comes first.
func (b *Bus) authedBody(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, principal, *apiError) {
	raw, aerr := b.readBody(w, r)
	if aerr != nil {
		return nil, principal{}, aerr
	}
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return nil, principal{}, aerr
	}
	return raw, p, nil
}

// str reads an optional string member; a present non-string is an error.
func str(raw map[string]json.RawMessage, key string) (string, *apiError) {
	v, ok := raw[key]
	if !ok || string(v) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", errf(http.StatusBadRequest, CodeMissingFields, "%s must be a string", key)
	}
	s = strings.TrimSpace(s)
	if len(s) > maxFieldBytes {
		return "", errf(http.StatusBadRequest, CodeMissingFields, "%s is longer than %d bytes", key, maxFieldBytes)
	}
	return s, nil
}

// sendRequest is a validated POST /v1/beam/send.
type sendRequest struct {
	from, to, intent string
	payload          json.RawMessage
	nonce            string
	priority         int
	traceID          string
	frame            *wire.IntentFrame // the sender's signed frame (signature auth)
	auth             string            // directory.BusAuth*
}

func (b *Bus) handleSend(w http.ResponseWriter, r *http.Request) *apiError {
	raw, aerr := b.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	req, aerr := b.parseSend(r, raw)
	if aerr != nil {
		return aerr
	}
	if b.cfg.AllowSender != nil {
		if ok, wait := b.cfg.AllowSender(req.from); !ok {
			aerr := errf(http.StatusTooManyRequests, CodeRateLimited, "too many sends from %s; retry later", req.from)
			aerr.retryAfter = wait
			return aerr
		}
	}
	status, body, aerr := b.accept(r.Context(), req)
	if aerr != nil {
		return aerr
	}
	writeJSON(w, status, body)
	return nil
}

// parseSend authenticates and validates a send body: {from|sender, to,
// intent, payload?, nonce?, priority?, trace_id?}, or {frame: signed beam/1
// frame | beam/2 JWS string, priority?, trace_id?}, or a signed beam/1
// frame as the whole body.
func (b *Bus) parseSend(r *http.Request, raw map[string]json.RawMessage) (*sendRequest, *apiError) {
	req := &sendRequest{}
	var frameRaw json.RawMessage
	if fr, ok := raw["frame"]; ok && string(fr) != "null" {
		frameRaw = fr
	} else if _, signed := raw["signature"]; signed {
		if _, ok := raw["timestamp"]; ok {
			whole, _ := json.Marshal(raw)
			frameRaw = whole
		}
	}
	if frameRaw != nil {
		f, aerr := b.verifyFrame(frameRaw)
		if aerr != nil {
			return nil, aerr
		}
		req.frame = f
	}
	var p principal
	if req.frame == nil {
		var aerr *apiError
		if p, aerr = b.authenticate(r); aerr != nil {
			return nil, aerr
		}
	}
	var aerr *apiError
	if req.traceID, aerr = str(raw, "trace_id"); aerr != nil {
		return nil, aerr
	}
	if pr, ok := raw["priority"]; ok && string(pr) != "null" {
		var v float64
		if err := json.Unmarshal(pr, &v); err != nil || math.IsNaN(v) || math.Abs(v) > 1e6 {
			return nil, errf(http.StatusBadRequest, CodeInvalidPayload, "priority must be a number between -1e6 and 1e6")
		}
		req.priority = int(v)
	}
	if f := req.frame; f != nil {
		req.from, req.to, req.intent, req.nonce = f.From, f.To, f.Intent, f.Nonce
		req.payload = json.RawMessage(f.Payload)
		if f.Signature != "" {
			req.auth = directory.BusAuthSignature
		} else {
			req.auth = directory.BusAuthJWS
		}
	} else {
		if req.from, aerr = str(raw, "from"); aerr != nil {
			return nil, aerr
		}
		if req.from == "" {
			if req.from, aerr = str(raw, "sender"); aerr != nil {
				return nil, aerr
			}
		}
		if req.to, aerr = str(raw, "to"); aerr != nil {
			return nil, aerr
		}
		if req.intent, aerr = str(raw, "intent"); aerr != nil {
			return nil, aerr
		}
		if req.from == "" || req.to == "" || req.intent == "" {
			return nil, errf(http.StatusBadRequest, CodeMissingFields, "from, to and intent are required")
		}
		if req.nonce, aerr = str(raw, "nonce"); aerr != nil {
			return nil, aerr
		}
		if pl, ok := raw["payload"]; ok && string(pl) != "null" {
			if objectOrNil(pl) == nil || !json.Valid(pl) {
				return nil, errf(http.StatusBadRequest, CodeInvalidPayload, "payload must be a JSON object")
			}
			req.payload = pl
		}
		if !p.canActAs(req.from) {
			return nil, errf(http.StatusForbidden, CodeForbidden, "the API key of %s may not send as %s", p.agent, req.from)
		}
		req.auth = p.via
		if p.via == "operator" {
			req.auth = directory.BusAuthBusKey
		}
	}
	if len(req.payload) == 0 {
		req.payload = json.RawMessage("{}")
	}
	if req.nonce == "" {
		req.nonce = wire.NewNonce()
	}
	if _, ok := b.reg.Get(req.from); !ok {
		return nil, errf(http.StatusNotFound, CodeUnknownAgent, "sender %s is not registered here", req.from)
	}
	if !b.reg.Serves(req.from) {
		return nil, errf(http.StatusForbidden, CodeForbidden, "sender %s is in a domain this directory does not serve", req.from)
	}
	_, local := b.reg.Get(req.to)
	local = local && b.reg.Serves(req.to)
	if !local {
		peer := b.remotePeer(req.to)
		if peer == "" {
			return nil, b.unknownRecipient(req.to)
		}
		// The peer applies its own policies (and its agent's
		// requireSenderSignatures setting) to its agent (remote.go).
	} else if ok, reason := b.reg.Allowed(req.from, req.to, req.intent); !ok {
		msg := fmt.Sprintf("ACL denied intent %s from %s to %s", req.intent, req.from, req.to)
		if reason != "" {
			msg += " (" + reason + ")"
		}
		return nil, errf(http.StatusForbidden, CodeForbidden, "%s", msg)
	} else if aerr := b.checkEndToEnd(req); aerr != nil {
		return nil, aerr
	}
	probe := req.frame
	if probe == nil || req.auth != directory.BusAuthSignature {
		probe = wire.NewIntentFrame(req.from, req.to, req.intent, req.payload, b.clock())
		probe.Nonce = req.nonce
	}
	// An unsigned frame is delivered attested, with a signature.
	size, err := probe.SignedDeliverySize()
	if err != nil {
		return nil, errf(http.StatusBadRequest, CodeInvalidPayload, "payload cannot be delivered: %v", err)
	}
	if size > b.dir.MaxFrameBytes() {
		return nil, errf(http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
			"the delivered frame would be %d bytes; recipients accept at most %d", size, b.dir.MaxFrameBytes())
	}
	return req, nil
}

// verifyFrame checks a sender-signed frame: a beam/1 frame object whose
// signature verifies with the registered key and whose timestamp is within
// ±5 minutes, or a beam/2 JWS string.
func (b *Bus) verifyFrame(raw json.RawMessage) (*wire.IntentFrame, *apiError) {
	var tok string
	if json.Unmarshal(raw, &tok) == nil {
		f, err := wire.DecodeIntentJWS(tok, func(kid string) (ed25519.PublicKey, error) {
			a, ok := b.reg.Get(kid)
			if !ok {
				return nil, fmt.Errorf("unknown signer %s", kid)
			}
			return a.PublicKey, nil
		})
		if err != nil {
			var dup *wire.DuplicateKeyError
			var fe *wire.FrameError
			if errors.As(err, &dup) || errors.As(err, &fe) {
				// Signed, but not a frame every reader reads alike.
				return nil, errf(http.StatusBadRequest, CodeInvalidPayload, "invalid frame: %v", err)
			}
			return nil, errf(http.StatusUnauthorized, CodeUnauthorized, "beam/2 frame does not verify: %v", err)
		}
		f.Signature = ""
		f.Raw = nil
		if aerr := checkFrameFields(f); aerr != nil {
			return nil, aerr
		}
		if aerr := b.checkFresh(f); aerr != nil {
			return nil, aerr
		}
		return f, nil
	}
	f, err := wire.DecodeIntentFrame(raw)
	if err != nil {
		return nil, errf(http.StatusBadRequest, CodeInvalidPayload, "invalid frame: %v", err)
	}
	if aerr := checkFrameFields(f); aerr != nil {
		return nil, aerr
	}
	if f.Signature == "" {
		return nil, errf(http.StatusUnauthorized, CodeUnauthorized, "the frame carries no signature")
	}
	sender, ok := b.reg.Get(f.From)
	if !ok {
		return nil, errf(http.StatusNotFound, CodeUnknownAgent, "sender %s is not registered here", f.From)
	}
	if err := f.Verify(sender.PublicKey); err != nil {
		return nil, errf(http.StatusUnauthorized, CodeUnauthorized, "signature verification failed")
	}
	if aerr := b.checkFresh(f); aerr != nil {
		return nil, aerr
	}
	return f, nil
}

// checkFresh applies the one freshness rule every entry path shares to a
// sender-signed frame (beam/1 or beam/2): its timestamp within ±5 minutes
// of now. The nonce rules apply later, when the message is recorded.
func (b *Bus) checkFresh(f *wire.IntentFrame) *apiError {
	ts, err := wire.ParseTimestamp(f.Timestamp)
	if err != nil {
		return errf(http.StatusBadRequest, CodeInvalidPayload, "invalid frame timestamp")
	}
	if d := b.clock().Sub(ts); d > signedFrameWindow || d < -signedFrameWindow {
		return errf(http.StatusUnauthorized, CodeUnauthorized, "signed frame timestamp is outside the 5 minute window")
	}
	return nil
}

func checkFrameFields(f *wire.IntentFrame) *apiError {
	for _, s := range []string{f.From, f.To, f.Intent, f.Nonce} {
		if s == "" || len(s) > maxFieldBytes {
			return errf(http.StatusBadRequest, CodeMissingFields, "frame from, to, intent and nonce must be 1-%d bytes", maxFieldBytes)
		}
	}
	return nil
}

// payloadHash is the hex SHA-256 of the JavaScript-normalised payload, the
// same hash the directory records, so either side detects a reused nonce.
func payloadHash(payload []byte) string {
	js, err := wire.JSStringify(payload)
	if err != nil {
		js = payload
	}
	sum := sha256.Sum256(js)
	return hex.EncodeToString(sum[:])
}

func newMessageID() string {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	return hex.EncodeToString(raw[:])
}

// dedupe answers a send whose nonce exists: the same message again is
// 200 deduped; anything else is 409 NONCE_REUSE_CONFLICT.
func (b *Bus) dedupe(ctx context.Context, ir tracing.IntentRow, req *sendRequest, hash string) (int, any, *apiError) {
	conflict := errf(http.StatusConflict, CodeNonceReuse, "nonce %s was already used for a different message", req.nonce)
	if ir.Owner != tracing.OwnerBus || ir.From != req.from || ir.To != req.to || ir.IntentType != req.intent {
		return 0, nil, conflict
	}
	first, err := b.firstDetails(ctx, req.nonce)
	if err != nil {
		return 0, nil, errf(http.StatusInternalServerError, CodeInternal, "look up nonce failed")
	}
	if h, _ := first.Extra["payloadHash"].(string); h != hash {
		return 0, nil, conflict
	}
	row, ok, err := b.message(ctx, req.nonce)
	if err != nil || !ok {
		return 0, nil, conflict
	}
	return http.StatusOK, b.sendResponse(ctx, row, true), nil
}

// sendResponse is the body of a send or requeue answer.
func (b *Bus) sendResponse(ctx context.Context, row tracing.MessageRow, deduped bool) map[string]any {
	out := map[string]any{
		"message_id": row.ID, "nonce": row.Nonce, "status": row.Status, "created_at": row.CreatedAt,
		"retry_count": row.RetryCount,
	}
	if deduped {
		out["deduped"] = true
	}
	if row.NextRetryAt != nil {
		out["next_retry_at"] = *row.NextRetryAt
	}
	switch row.Status {
	case tracing.Queued, tracing.DeadLetter, tracing.Failed:
		if row.Error != "" {
			out["error"] = row.Error
		}
		if row.Error == "" {
			// Every event that records an error code records an error.
			break
		}
		if ir, ok, err := b.log.Intent(ctx, row.Nonce); err == nil && ok && ir.ErrorCode != "" {
			out["error_code"] = ir.ErrorCode
		}
	}
	return out
}

// messageView is a beam_messages row as the API shows it (epoch seconds,
// snake_case, JSON fields parsed): the wire type the Go SDK reads.
type messageView = wire.BusMessage

func rawOrNull(r tracing.RawJSON) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return json.RawMessage(r)
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func view(m tracing.MessageRow, withLease bool) messageView {
	v := messageView{
		ID: m.ID, Nonce: m.Nonce, Sender: m.Sender, Recipient: m.Recipient, Intent: m.Intent,
		Payload: rawOrNull(m.Payload), Status: string(m.Status), Priority: m.Priority, RetryCount: m.RetryCount,
		MaxRetries: m.MaxRetries, NextRetryAt: m.NextRetryAt, CreatedAt: m.CreatedAt, DeliveredAt: m.DeliveredAt,
		AckedAt: m.AckedAt, FailedAt: m.FailedAt, Error: strOrNil(m.Error), Response: rawOrNull(m.Response),
		TraceID: strOrNil(m.TraceID), Metadata: rawOrNull(m.Metadata), LeaseExpiresAt: m.LeaseExpiresAt,
		UpdatedAt: m.UpdatedAt,
	}
	if withLease {
		v.LeaseID = m.LeaseOwner
	}
	return v
}

// messageViews shows rows as the API does; withLease adds each row's lease
// id.
func messageViews(rows []tracing.MessageRow, withLease bool) []messageView {
	msgs := make([]messageView, 0, len(rows))
	for _, m := range rows {
		msgs = append(msgs, view(m, withLease))
	}
	return msgs
}

// writeMessages answers a list request with {"messages", "count"}: the
// messages q selects. what names the list when the query fails.
func (b *Bus) writeMessages(w http.ResponseWriter, r *http.Request, what string, q tracing.MessageQuery) *apiError {
	rows, err := b.log.Messages(r.Context(), q)
	if err != nil {
		return b.internal(what, err)
	}
	msgs := messageViews(rows, false)
	writeJSON(w, http.StatusOK, map[string]any{"messages": msgs, "count": len(msgs)})
	return nil
}

// intParam parses an optional integer query parameter, clamped to [1, max].
func intParam(r *http.Request, key string, def, max int) int {
	v, err := strconv.Atoi(r.URL.Query().Get(key))
	if err != nil || v <= 0 {
		return def
	}
	return min(v, max)
}

// floatParam parses an optional epoch-seconds query parameter.
func floatParam(r *http.Request, key string) (*float64, *apiError) {
	s := r.URL.Query().Get(key)
	if s == "" {
		return nil, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, errf(http.StatusBadRequest, CodeInvalidPayload, "%s must be epoch seconds", key)
	}
	return &v, nil
}

func statusParam(r *http.Request, def string) (string, *apiError) {
	s := r.URL.Query().Get("status")
	if s == "" {
		return def, nil
	}
	if _, err := tracing.ParseState(s); err != nil {
		return "", errf(http.StatusBadRequest, CodeInvalidStatus, "unknown status %q", truncate(s))
	}
	return s, nil
}

// leaseDuration turns a requested lease of v seconds, parsed with err, into
// a duration; a parse error or a value outside (0, MaxLease] is a 400.
func (b *Bus) leaseDuration(v float64, err error) (time.Duration, *apiError) {
	if err != nil || v <= 0 || math.IsNaN(v) || v > b.cfg.MaxLease.Seconds() {
		return 0, errf(http.StatusBadRequest, CodeInvalidPayload, "lease must be seconds in (0, %g]", b.cfg.MaxLease.Seconds())
	}
	return time.Duration(v * float64(time.Second)), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func (b *Bus) handlePoll(w http.ResponseWriter, r *http.Request) *apiError {
	agent := strings.TrimSpace(r.URL.Query().Get("agent"))
	if agent == "" {
		return errf(http.StatusBadRequest, CodeMissingAgent, "the agent query parameter is required")
	}
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	if !p.canActAs(agent) {
		return errf(http.StatusForbidden, CodeForbidden, "%s may not poll the inbox of %s", p.agent, truncate(agent))
	}
	if _, ok := b.reg.Get(agent); !ok {
		return errf(http.StatusNotFound, CodeUnknownAgent, "agent %s is not registered here", truncate(agent))
	}
	limit := intParam(r, "limit", defaultPollLimit, maxPollLimit)
	q := r.URL.Query()
	if c := q.Get("claim"); c == "true" || c == "1" {
		lease := b.cfg.DefaultLease
		if s := q.Get("lease"); s != "" {
			if lease, aerr = b.leaseDuration(strconv.ParseFloat(s, 64)); aerr != nil {
				return aerr
			}
		}
		rows, err := b.claimLeases(r.Context(), agent, limit, lease)
		if err != nil && len(rows) == 0 {
			return b.internal("poll claim", err)
		}
		msgs := messageViews(rows, true)
		body := map[string]any{"messages": msgs, "count": len(msgs)}
		if len(rows) > 0 {
			body["lease_id"] = rows[0].LeaseOwner
			body["lease_expires_at"] = rows[0].LeaseExpiresAt
		}
		writeJSON(w, http.StatusOK, body)
		return nil
	}
	status, aerr := statusParam(r, string(tracing.Delivered))
	if aerr != nil {
		return aerr
	}
	since, aerr := floatParam(r, "since")
	if aerr != nil {
		return aerr
	}
	return b.writeMessages(w, r, "poll", tracing.MessageQuery{Recipient: agent, Status: tracing.State(status),
		CreatedAfter: since, CreatedSince: new(b.registeredSince(agent)), Order: tracing.OldestFirst, Limit: limit})
}

// lookup finds a message by message_id or nonce from a JSON body.
func (b *Bus) lookup(ctx context.Context, raw map[string]json.RawMessage) (string, *apiError) {
	id, aerr := str(raw, "message_id")
	if aerr != nil {
		return "", aerr
	}
	nonce, aerr := str(raw, "nonce")
	if aerr != nil {
		return "", aerr
	}
	if id == "" && nonce == "" {
		return "", errf(http.StatusBadRequest, CodeMissingMessageID, "message_id or nonce is required")
	}
	if id != "" {
		n, ok, err := b.nonceOfID(ctx, id)
		if err != nil {
			return "", errf(http.StatusInternalServerError, CodeInternal, "look up failed")
		}
		if !ok {
			return "", errf(http.StatusNotFound, CodeMessageNotFound, "message %s not found", id)
		}
		if nonce != "" && nonce != n {
			return "", errf(http.StatusBadRequest, CodeInvalidPayload, "message_id and nonce name different messages")
		}
		return n, nil
	}
	return nonce, nil
}

func (b *Bus) handleAck(w http.ResponseWriter, r *http.Request) *apiError {
	raw, p, aerr := b.authedBody(w, r)
	if aerr != nil {
		return aerr
	}
	status, aerr := str(raw, "status")
	if aerr != nil {
		return aerr
	}
	if status == "" {
		status = string(tracing.Acked)
	}
	if status != string(tracing.Acked) && status != string(tracing.Failed) {
		return errf(http.StatusBadRequest, CodeInvalidStatus, "status must be acked or failed")
	}
	var response json.RawMessage
	if rv, ok := raw["response"]; ok && string(rv) != "null" {
		if objectOrNil(rv) == nil {
			return errf(http.StatusBadRequest, CodeInvalidPayload, "response must be a JSON object")
		}
		response = rv
	}
	leaseID, aerr := str(raw, "lease_id")
	if aerr != nil {
		return aerr
	}
	nonce, aerr := b.lookup(r.Context(), raw)
	if aerr != nil {
		return aerr
	}
	row, aerr := b.ack(r.Context(), p, nonce, tracing.State(status), response, leaseID)
	if aerr != nil {
		return aerr
	}
	writeJSON(w, http.StatusOK, map[string]any{"message_id": row.ID, "nonce": row.Nonce, "status": row.Status, "updated_at": row.UpdatedAt})
	return nil
}

// ack records a consumer's completion: delivered → acked|failed, or for a
// message dispatched under a live poll lease held by leaseID, dispatched →
// delivered → acked|failed.
func (b *Bus) ack(ctx context.Context, p principal, nonce string, status tracing.State, response json.RawMessage, leaseID string) (tracing.MessageRow, *apiError) {
	unlock := b.lock(nonce)
	c, aerr := b.recipientCurrent(ctx, p, nonce, "ack")
	row, n := c.MessageRow, c.Attempt
	if aerr != nil {
		unlock()
		return row, aerr
	}
	now := b.clock()
	var pre []tracing.Event
	transport := transportBus
	switch row.Status {
	case tracing.Delivered:
	case tracing.Dispatched:
		e := errf(http.StatusConflict, CodeInvalidState, "message %s is dispatched under a poll lease that %s", row.ID, "is not yours")
		switch {
		case row.LeaseOwner == "":
			e.msg, e.reason = fmt.Sprintf("message %s is being delivered over WebSocket; ack it once delivered", row.ID), reasonWebSocketInFlux
		case leaseID != row.LeaseOwner:
			e.reason = reasonLeaseMismatch
		case row.LeaseExpiresAt == nil || *row.LeaseExpiresAt <= secs(now):
			e.msg, e.reason = fmt.Sprintf("the lease on message %s has expired", row.ID), reasonLeaseExpired
		default:
			e = nil
		}
		if e != nil {
			unlock()
			return row, e
		}
		transport = transportPoll
		pre = append(pre, event(row, tracing.Delivered, transportPoll, n))
	default:
		unlock()
		e := errf(http.StatusConflict, CodeInvalidState, "Invalid message %s lifecycle transition from %s to %s", row.ID, row.Status, status)
		if row.Status == tracing.Queued && leaseID != "" {
			e.reason = reasonLeaseExpired
		}
		return row, e
	}
	lat := latencyMs(row, now)
	ev := event(row, status, transport, n)
	var result []byte
	if status == tracing.Acked {
		result = successResult(row.Nonce, response, now, lat)
		ev.Details = tracing.Details{Response: response, Result: result, LatencyMs: lat, Extra: map[string]any{"ackedBy": ackedBy(p)}}
	} else {
		msg := "Manually failed"
		if len(response) > 0 {
			msg = string(response)
		}
		result = wire.FailureResult(row.Nonce, CodeConsumerFailed, msg, now, lat)
		ev.Details = tracing.Details{ErrorCode: CodeConsumerFailed, Error: msg, Response: response, Result: result,
			LatencyMs: lat, Extra: map[string]any{"ackedBy": ackedBy(p)}}
	}
	err := b.append(append(pre, ev)...)
	if err == nil {
		row, _, err = b.message(ctx, nonce)
	}
	unlock()
	if err != nil {
		var te *tracing.TransitionError
		if errors.As(err, &te) {
			return row, errf(http.StatusConflict, CodeInvalidState, "message %s changed state meanwhile", row.ID)
		}
		b.lg.Error("bus: record ack", "nonce", nonce, "err", err)
		return row, errf(http.StatusInternalServerError, CodeInternal, "ack could not be recorded")
	}
	b.forget(nonce)
	b.m.outcomes.WithLabelValues(string(status)).Inc()
	b.notifySender(row, status, result)
	return row, nil
}

// recipientCurrent reads nonce's message for a change only its recipient may
// make (action, as in "only the recipient … may <action> message …"): a
// failed read is a 500, an unknown nonce a 404 and a principal that cannot
// act as the recipient a 403. The caller holds the nonce's lock.
func (b *Bus) recipientCurrent(ctx context.Context, p principal, nonce, action string) (current, *apiError) {
	c, ok, err := b.current(ctx, nonce)
	if err != nil {
		return c, errf(http.StatusInternalServerError, CodeInternal, "look up failed")
	}
	if !ok {
		return c, errf(http.StatusNotFound, CodeMessageNotFound, "message %s not found", truncate(nonce))
	}
	if !p.canActAs(c.Recipient) {
		return c, errf(http.StatusForbidden, CodeForbidden, "only the recipient %s may %s message %s", c.Recipient, action, c.ID)
	}
	return c, nil
}

func ackedBy(p principal) string {
	if p.agent != "" {
		return p.agent
	}
	return p.via
}

func (b *Bus) handleLease(w http.ResponseWriter, r *http.Request) *apiError {
	raw, p, aerr := b.authedBody(w, r)
	if aerr != nil {
		return aerr
	}
	leaseID, aerr := str(raw, "lease_id")
	if aerr != nil {
		return aerr
	}
	if leaseID == "" {
		return errf(http.StatusBadRequest, CodeMissingFields, "lease_id is required")
	}
	lease := b.cfg.DefaultLease
	if lv, ok := raw["lease"]; ok {
		var v float64
		err := json.Unmarshal(lv, &v)
		if lease, aerr = b.leaseDuration(v, err); aerr != nil {
			return aerr
		}
	}
	nonce, aerr := b.lookup(r.Context(), raw)
	if aerr != nil {
		return aerr
	}
	row, aerr := b.renew(r.Context(), p, nonce, leaseID, lease)
	if aerr != nil {
		return aerr
	}
	writeJSON(w, http.StatusOK, map[string]any{"message_id": row.ID, "nonce": row.Nonce, "lease_id": row.LeaseOwner,
		"lease_expires_at": row.LeaseExpiresAt})
	return nil
}

// renew extends a live poll lease held by leaseID to now + lease.
func (b *Bus) renew(ctx context.Context, p principal, nonce, leaseID string, lease time.Duration) (tracing.MessageRow, *apiError) {
	unlock := b.lock(nonce)
	defer unlock()
	c, aerr := b.recipientCurrent(ctx, p, nonce, "renew leases on")
	row, n := c.MessageRow, c.Attempt
	if aerr != nil {
		return row, aerr
	}
	now := b.clock()
	if row.Status != tracing.Dispatched || row.LeaseOwner != leaseID || row.LeaseExpiresAt == nil || *row.LeaseExpiresAt <= secs(now) {
		e := errf(http.StatusConflict, CodeInvalidState, "message %s is not under a live lease %s", row.ID, truncate(leaseID))
		e.reason = reasonLeaseExpired
		return row, e
	}
	ev := event(row, tracing.Dispatched, transportPoll, n)
	ev.Details = tracing.Details{LeaseOwner: leaseID, LeaseExpiresAt: now.Add(lease).UnixMilli(), TimeoutMs: lease.Milliseconds(),
		Extra: map[string]any{"leaseRenewed": true}}
	if err := b.append(ev); err != nil {
		b.lg.Error("bus: renew lease", "nonce", nonce, "err", err)
		return row, errf(http.StatusInternalServerError, CodeInternal, "lease could not be renewed")
	}
	row, _, err := b.message(ctx, nonce)
	if err != nil {
		return row, errf(http.StatusInternalServerError, CodeInternal, "look up failed")
	}
	return row, nil
}

func (b *Bus) handleMessage(w http.ResponseWriter, r *http.Request) *apiError {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	id := r.PathValue("id")
	nonce, ok, err := b.nonceOfID(r.Context(), id)
	if err != nil {
		return b.internal("message", err)
	}
	if !ok {
		nonce = id
	}
	row, ok, err := b.message(r.Context(), nonce)
	if err != nil {
		return b.internal("message", err)
	}
	if !ok {
		return errf(http.StatusNotFound, CodeMessageNotFound, "message %s not found", truncate(id))
	}
	if !p.canActAs(row.Sender) && !p.canActAs(row.Recipient) || !p.trusted && row.CreatedAt < b.registeredSince(p.agent) {
		return errf(http.StatusForbidden, CodeForbidden, "message %s is neither from nor to %s", row.ID, p.agent)
	}
	writeJSON(w, http.StatusOK, view(row, p.canActAs(row.Recipient)))
	return nil
}

// scope restricts an agent principal to its own messages, created since
// its registration (registeredSince).
func (b *Bus) scope(p principal, q *tracing.MessageQuery) {
	if p.trusted {
		return
	}
	q.Party = p.agent
	if since := b.registeredSince(p.agent); q.CreatedSince == nil || *q.CreatedSince < since {
		q.CreatedSince = &since
	}
}

// filters reads the sender, recipient and intent filters of a list request.
func filters(r *http.Request, q *tracing.MessageQuery) *apiError {
	for _, f := range []struct {
		key string
		dst *string
	}{{"sender", &q.Sender}, {"recipient", &q.Recipient}, {"intent", &q.Intent}} {
		if v := r.URL.Query().Get(f.key); v != "" {
			if len(v) > maxFilterBytes {
				return errf(http.StatusBadRequest, CodeInvalidPayload, "%s is too long", f.key)
			}
			*f.dst = v
		}
	}
	return nil
}

func (b *Bus) handleHistory(w http.ResponseWriter, r *http.Request) *apiError {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	q := tracing.MessageQuery{Order: tracing.NewestFirst, Limit: intParam(r, "limit", defaultHistoryLimit, maxListLimit)}
	if aerr := filters(r, &q); aerr != nil {
		return aerr
	}
	status, aerr := statusParam(r, "")
	if aerr != nil {
		return aerr
	}
	q.Status = tracing.State(status)
	if q.CreatedSince, aerr = floatParam(r, "since"); aerr != nil {
		return aerr
	}
	if q.CreatedUntil, aerr = floatParam(r, "until"); aerr != nil {
		return aerr
	}
	b.scope(p, &q)
	return b.writeMessages(w, r, "history", q)
}

func (b *Bus) handleDeadLetters(w http.ResponseWriter, r *http.Request) *apiError {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	q := tracing.MessageQuery{Status: tracing.DeadLetter, Order: tracing.RecentlyFailedFirst,
		Limit: intParam(r, "limit", defaultDeadLimit, maxListLimit)}
	if aerr := filters(r, &q); aerr != nil {
		return aerr
	}
	b.scope(p, &q)
	return b.writeMessages(w, r, "dead letters", q)
}

func (b *Bus) handleStats(w http.ResponseWriter, r *http.Request) *apiError {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	ctx := r.Context()
	var q tracing.MessageQuery
	b.scope(p, &q)
	counts, err := b.log.MessageCountsByState(ctx, q)
	if err != nil {
		return b.internal("stats", err)
	}
	body := map[string]any{}
	var total int64
	for _, s := range tracing.States {
		body[string(s)] = counts[s]
		total += counts[s]
	}
	body["total"] = total
	byAgent := map[string]map[string]int64{}
	for _, side := range []struct {
		bySender bool
		key      string
	}{{true, "sent"}, {false, "received"}} {
		perAgent, err := b.log.MessageCountsByAgent(ctx, side.bySender, q, 1000)
		if err != nil {
			return b.internal("stats", err)
		}
		for id, n := range perAgent {
			if byAgent[id] == nil {
				byAgent[id] = map[string]int64{"sent": 0, "received": 0}
			}
			byAgent[id][side.key] = n
		}
	}
	body["by_agent"] = byAgent
	if since := secs(b.clock().Add(-24 * time.Hour)); q.CreatedSince == nil || *q.CreatedSince < since {
		q.CreatedSince = &since
	}
	day, err := b.log.SummarizeMessages(ctx, q)
	if err != nil {
		return b.internal("stats", err)
	}
	body["last_24h"] = day.Total
	writeJSON(w, http.StatusOK, body)
	return nil
}

func (b *Bus) handleRequeue(w http.ResponseWriter, r *http.Request) *apiError {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	if !p.trusted {
		return errf(http.StatusForbidden, CodeForbidden, "requeue needs the bus key or the operator token")
	}
	id := r.PathValue("id")
	err := b.Requeue(r.Context(), id)
	var se *StateError
	switch {
	case errors.Is(err, ErrNotFound):
		return errf(http.StatusNotFound, CodeMessageNotFound, "message %s not found", truncate(id))
	case errors.As(err, &se):
		return errf(http.StatusConflict, CodeInvalidState, "message %s is %s; only dead_letter or failed messages can be requeued", id, se.Status)
	case err != nil:
		return b.internal("requeue", err)
	}
	nonce, _, err := b.nonceOfID(r.Context(), id)
	if err != nil {
		return b.internal("requeue", err)
	}
	b.waitSettled(r.Context(), nonce)
	row, ok, err := b.message(r.Context(), nonce)
	if err != nil || !ok {
		return b.internal("requeue", fmt.Errorf("read back %s: %v", id, err))
	}
	body := b.sendResponse(r.Context(), row, false)
	body["requeued"] = true
	writeJSON(w, http.StatusOK, body)
	return nil
}
