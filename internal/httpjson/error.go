package httpjson

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// CodeInternal is the errorCode of a server fault.
const CodeInternal = "INTERNAL_ERROR"

// Error is an error answer of an HTTP route: a status, an error code and a
// message the client may read, plus members of the body some routes add
// (e.g. "reason"), a Retry-After and an optional cause. The cause is for
// logs and errors.Is/As; it never reaches the client.
type Error struct {
	// Status is the HTTP status.
	Status int
	// Code is the errorCode.
	Code string
	// Message is the error text the client reads.
	Message string
	// Fields are further members of the body; they never replace "error"
	// or "errorCode".
	Fields map[string]any
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// at least one).
	RetryAfter time.Duration
	// Err is the cause, when there is one.
	Err error
}

// New returns an Error with status, code and msg.
func New(status int, code, msg string) *Error {
	return &Error{Status: status, Code: code, Message: msg}
}

// Errorf returns an Error with status, code and a formatted message.
func Errorf(status int, code, format string, args ...any) *Error {
	return New(status, code, fmt.Sprintf(format, args...))
}

// BadRequest is New with status 400.
func BadRequest(code, msg string) *Error { return New(http.StatusBadRequest, code, msg) }

// NotFound is New with status 404.
func NotFound(code, msg string) *Error { return New(http.StatusNotFound, code, msg) }

// WriteError writes the Beam error shape {"error": msg, "errorCode": code}
// with status. Routes return an *Error to their Adapter instead; this is
// for middleware that answers before any route runs.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	Beam(w, New(status, code, msg))
}

// Internal is a server fault: 500 INTERNAL_ERROR with msg, carrying cause.
// The adapter logs the cause; the client reads only msg.
func Internal(msg string, cause error) *Error {
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: msg, Err: cause}
}

// Error returns the message, followed by the cause when there is one.
func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// With returns e with the body member key set to v.
func (e *Error) With(key string, v any) *Error {
	if e.Fields == nil {
		e.Fields = map[string]any{}
	}
	e.Fields[key] = v
	return e
}

// body returns the Beam error shape of e: {"error", "errorCode"} and the
// Fields. Its members encode in sorted order.
func (e *Error) body() map[string]any {
	b := make(map[string]any, len(e.Fields)+2)
	for k, v := range e.Fields {
		b[k] = v
	}
	b["error"], b["errorCode"] = e.Message, e.Code
	return b
}

// Marshal returns the Beam error shape of e as Beam writes it, for an
// answer that is relayed rather than written (a cluster call's reply).
func (e *Error) Marshal() []byte {
	b, err := encode(e.body())
	if err != nil {
		return []byte(internalBody)
	}
	return b
}

// SetRetryAfter sets the Retry-After header when e asks for one.
func (e *Error) SetRetryAfter(h http.Header) {
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(max(1, int((e.RetryAfter+time.Second-1)/time.Second))))
	}
}

// shape writes an Error in a protocol's error shape.
type shape func(w http.ResponseWriter, e *Error)

// Beam writes e in the Beam error shape {"error", "errorCode", ...}.
func Beam(w http.ResponseWriter, e *Error) {
	e.SetRetryAfter(w.Header())
	Write(w, e.Status, e.body())
}

// HandlerFunc is an HTTP handler that returns its error instead of writing
// it.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Adapter serves HandlerFuncs: a returned *Error (found with errors.As) is
// written in Shape; any other error is logged and answered with Fault; nil
// writes nothing. The zero Adapter writes the Beam shape and logs to
// slog.Default.
type Adapter struct {
	// Shape writes errors; nil is Beam.
	Shape shape
	// Log receives server faults; nil is slog.Default().
	Log *slog.Logger
	// Fault is the answer to an error that is not an *Error; nil is
	// 500 INTERNAL_ERROR "internal error".
	Fault *Error
}

// Handler returns h as an http.HandlerFunc served by a.
func (a Adapter) Handler(h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			a.WriteErr(w, r, err)
		}
	}
}

// WriteErr answers r with err as Handler does. It is for the few places
// that answer outside a HandlerFunc (middleware in front of a route).
func (a Adapter) WriteErr(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	if !errors.As(err, &e) {
		a.log().Error("http handler failed", "method", r.Method, "path", r.URL.Path, "err", err)
		e = a.Fault
		if e == nil {
			e = Internal("internal error", nil)
		}
	} else if e.Err != nil && e.Status >= http.StatusInternalServerError {
		a.log().Error("http handler failed", "method", r.Method, "path", r.URL.Path,
			"status", e.Status, "errorCode", e.Code, "err", e.Err)
	}
	shape := a.Shape
	if shape == nil {
		shape = Beam
	}
	shape(w, e)
}

func (a Adapter) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.Default()
}
