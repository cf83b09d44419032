package jobs

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is an answer in the shape of RFC §11:
// {"error":{"code","message"}}.
type apiError struct {
	status     int
	code       string
	message    string
	retryAfter int // seconds; 0: no Retry-After
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func apiErr(status int, code, msg string) *apiError {
	return &apiError{status: status, code: code, message: msg}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeError writes e in the RFC's error shape.
func writeError(w http.ResponseWriter, e *apiError) {
	var b errorBody
	b.Error.Code, b.Error.Message = e.code, e.message
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.status, b)
}

// securityHeaders are the headers of RFC §10, on every response.
func securityHeaders(h http.Header) {
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Intent-Version", "2.1")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
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
