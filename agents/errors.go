package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Error is a failure reported by the directory or by the recipient agent:
// an HTTP error body ({"error", "errorCode"}), a WebSocket error frame, or a
// result frame with success false. Callers branch on Code (for example
// "OFFLINE", "FORBIDDEN", "TIMEOUT", "NOT_FOUND" or an application code).
type Error struct {
	// Code is the errorCode of the failure; "UNKNOWN" when none was given.
	Code string
	// Message is the human-readable error text.
	Message string
	// Status is the HTTP status of the response, or 0 when the failure came
	// over the WebSocket or inside a result frame.
	Status int
	// Nonce is the nonce of the intent that failed, when Send knows it.
	Nonce string
}

// Error implements error.
func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("beam: %s (HTTP %d): %s", e.Code, e.Status, e.Message)
	}
	return fmt.Sprintf("beam: %s: %s", e.Code, e.Message)
}

// maxErrorText bounds the message taken from a body that is not in the
// Beam error shape.
const maxErrorText = 200

// ErrorFromResponse returns the *Error a non-2xx answer carries: the code
// and message of a Beam error body ({"error", "errorCode"}), else
// "NOT_FOUND" for a 404 and "HTTP_<status>" otherwise, with the start of
// the body (or the status text) as the message. body is the answer's body,
// already read.
func ErrorFromResponse(resp *http.Response, body []byte) *Error {
	var eb struct {
		Error     string `json:"error"`
		ErrorCode string `json:"errorCode"`
	}
	_ = json.Unmarshal(body, &eb)
	e := &Error{Code: eb.ErrorCode, Message: eb.Error, Status: resp.StatusCode}
	if e.Code == "" {
		switch resp.StatusCode {
		case http.StatusNotFound:
			e.Code = "NOT_FOUND"
		default:
			e.Code = "HTTP_" + strconv.Itoa(resp.StatusCode)
		}
	}
	if e.Message == "" && eb.ErrorCode == "" {
		text := strings.TrimSpace(string(body))
		if len(text) > maxErrorText {
			text = text[:maxErrorText]
		}
		e.Message = text
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(http.StatusText(resp.StatusCode))
	}
	return e
}

// ErrorCode returns the Code of err when err is (or wraps) an *Error, and
// "" otherwise.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

var (
	// ErrClosed is returned by methods called after Close.
	ErrClosed = errors.New("beam client: closed")
	// ErrConnectionLost is returned by a Send whose WebSocket session dropped
	// before the result arrived. The intent may or may not have been
	// delivered; sending it again creates a new intent.
	ErrConnectionLost = errors.New("beam client: connection lost before the result arrived")
	// ErrProtocolUnsupported is returned by NewClient for a protocol the
	// client does not know, and by Connect for a beam/2 client when the
	// directory does not confirm beam/2 for the session.
	ErrProtocolUnsupported = errors.New("beam client: protocol not supported by this directory yet")
)
