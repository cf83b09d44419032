package jobs

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/beamdir/beam/internal/httpjson"
)

// problem writes e in the shape of RFC §11: {"error":{"code","message"}},
// with Retry-After when e asks for one. It is the Shape of the protocol's
// httpjson.Adapter.
func problem(w http.ResponseWriter, e *httpjson.Error) {
	var b errorBody
	b.Error.Code, b.Error.Message = e.Code, e.Message
	e.SetRetryAfter(w.Header())
	reply(w, e.Status, b)
}

// WriteProblem writes e as the job bus answers errors: RFC §11's shape,
// Retry-After when e asks for one, and RFC §10's security headers. A
// cluster node forwarding the bus's requests answers its own errors so.
func WriteProblem(w http.ResponseWriter, e *httpjson.Error) {
	securityHeaders(w.Header())
	problem(w, e)
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// errInternal answers a failure that is not an *httpjson.Error.
var errInternal = httpjson.New(http.StatusInternalServerError, "internal_error", "Internal error.")

// securityHeaders are the headers of RFC §10, on every response.
func securityHeaders(h http.Header) {
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Intent-Version", "2.1")
}

// reply writes v as the JSON body of an answer with status.
func reply(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal_error","message":"Could not encode the response."}}`)
	}
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
