package bus

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Error codes of the bus's HTTP API ({"error", "errorCode"} bodies).
const (
	codeInvalidJSON       = "INVALID_JSON"
	codeMissingFields     = "MISSING_REQUIRED_FIELDS"
	codeInvalidPayload    = "INVALID_PAYLOAD"
	codeNonceReuse        = "NONCE_REUSE_CONFLICT"
	codeInProgress        = "IN_PROGRESS"
	codeMessageNotFound   = "MESSAGE_NOT_FOUND"
	codeMissingMessageID  = "MISSING_MESSAGE_ID"
	codeInvalidState      = "INVALID_STATE"
	codeInvalidStatus     = "INVALID_STATUS"
	codeMissingAgent      = "MISSING_AGENT"
	codeUnauthorized      = "UNAUTHORIZED"
	codeForbidden         = "FORBIDDEN"
	codePayloadTooLarge   = "PAYLOAD_TOO_LARGE"
	codeInternal          = "INTERNAL_ERROR"
	codeNotReplicated     = "NOT_REPLICATED"
	codeRateLimited       = "RATE_LIMITED"
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

// internal logs an unexpected failure of what and returns the 500 the
// client gets.
func (b *Bus) internal(what string, err error) *httpjson.Error {
	b.lg.Error("bus: "+what, "err", err)
	return httpjson.Errorf(http.StatusInternalServerError, codeInternal, "%s failed", what)
}

// api adapts a handler that returns its error (httpjson.Adapter): a
// non-nil error is written in the Beam error shape.
func (b *Bus) api(h func(http.ResponseWriter, *http.Request) *httpjson.Error) http.HandlerFunc {
	return httpjson.Adapter{Log: b.lg}.Handler(func(w http.ResponseWriter, r *http.Request) error {
		if e := h(w, r); e != nil {
			return e
		}
		return nil
	})
}

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
func (b *Bus) authenticate(r *http.Request) (principal, *httpjson.Error) {
	if p, ok := directory.BusPrincipalFrom(r.Context()); ok {
		// Another node of the cluster authenticated the client.
		return principal{agent: p.Agent, trusted: p.Trusted, via: p.Via}, nil
	}
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
		return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "Unauthorized: invalid API key")
	}
	if tok != "" {
		return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "Unauthorized: invalid token")
	}
	return principal{}, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized,
		"Unauthorized: send the agent's API key (x-api-key), the bus key or a signed frame")
}

// Principal returns who r's credentials authenticate (see authenticate),
// for a node of a cluster that forwards the request to another node.
func (b *Bus) Principal(r *http.Request) (directory.BusPrincipal, bool) {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return directory.BusPrincipal{}, false
	}
	return directory.BusPrincipal{Agent: p.agent, Trusted: p.trusted, Via: p.via}, true
}

// readBody reads a bounded JSON object body.
func (b *Bus) readBody(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, *httpjson.Error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(b.cfg.MaxBodyBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, httpjson.Errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body exceeds %d bytes", b.cfg.MaxBodyBytes)
		}
		return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "could not read the request body")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "request body must be a JSON object")
	}
	// encoding/json keeps the last of duplicated keys, other parsers the
	// first: a body (or a frame or payload in it) with one is refused, so
	// every reader sees the values the sender meant.
	var dup *wire.DuplicateKeyError
	if err := wire.CheckNoDuplicateKeys(body); errors.As(err, &dup) {
		return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "request body has a %s", dup.Error())
	}
	return raw, nil
}

// authedBody reads a bounded JSON object body, then authenticates the
// request; the body's error comes first.
func (b *Bus) authedBody(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, principal, *httpjson.Error) {
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
func str(raw map[string]json.RawMessage, key string) (string, *httpjson.Error) {
	v, ok := raw[key]
	if !ok || string(v) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", httpjson.Errorf(http.StatusBadRequest, codeMissingFields, "%s must be a string", key)
	}
	s = strings.TrimSpace(s)
	if len(s) > maxFieldBytes {
		return "", httpjson.Errorf(http.StatusBadRequest, codeMissingFields, "%s is longer than %d bytes", key, maxFieldBytes)
	}
	return s, nil
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
func floatParam(r *http.Request, key string) (*float64, *httpjson.Error) {
	s := r.URL.Query().Get(key)
	if s == "" {
		return nil, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "%s must be epoch seconds", key)
	}
	return &v, nil
}

func statusParam(r *http.Request, def string) (string, *httpjson.Error) {
	s := r.URL.Query().Get("status")
	if s == "" {
		return def, nil
	}
	if _, err := tracing.ParseState(s); err != nil {
		return "", httpjson.Errorf(http.StatusBadRequest, codeInvalidStatus, "unknown status %q", truncate(s))
	}
	return s, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
