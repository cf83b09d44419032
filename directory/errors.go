package directory

import (
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
)

// Error codes the relay reports, on HTTP in {"error", "errorCode"} bodies,
// on WebSocket in {"type":"error"} messages and in the failure result frames
// it records as an intent's result.
const (
	// codeInvalidJSON: the HTTP body is not JSON.
	codeInvalidJSON = "INVALID_JSON"
	// CodeInvalidIntent: the frame's shape is wrong, its sender is unknown or
	// its signature does not verify.
	CodeInvalidIntent = "INVALID_INTENT"
	// codeBadRequest: an authentic frame that cannot be relayed (timestamp
	// outside the window). HTTP reports it as INVALID_INTENT, as the
	// reference does.
	codeBadRequest = "BAD_REQUEST"
	// CodeForbidden: policy denies the intent, or a session acts for another
	// agent, or a result comes from someone who is not the recipient.
	CodeForbidden = "FORBIDDEN"
	// CodeInProgress: the nonce is still in flight.
	CodeInProgress = "IN_PROGRESS"
	// CodeNonceReuse: the nonce was used for a different intent.
	CodeNonceReuse = "NONCE_REUSE_CONFLICT"
	// codeFrameTooLarge: the frame to deliver exceeds MaxFrameBytes.
	codeFrameTooLarge = "FRAME_TOO_LARGE"
	// codePayloadTooLarge: the HTTP body exceeds the body limit.
	codePayloadTooLarge = "PAYLOAD_TOO_LARGE"
	// CodeOffline: the recipient is not reachable (retryable).
	CodeOffline = "OFFLINE"
	// CodeTimeout: no result arrived in time (retryable).
	CodeTimeout = "TIMEOUT"
	// CodeDeliveryFailed: the delivery was interrupted (retryable).
	CodeDeliveryFailed = "DELIVERY_FAILED"
	// codeDirectHTTPFailed: the recipient's HTTP endpoint failed and no
	// WebSocket session could take over (retryable).
	codeDirectHTTPFailed = "DIRECT_HTTP_FAILED"
	// CodeResultError: a failure result from the recipient without a code.
	CodeResultError = "RESULT_ERROR"
	// codeRateLimited: the sender sent more intents than its rate limit
	// allows (retryable after RelayError.RetryAfter).
	codeRateLimited = "RATE_LIMITED"
	// CodeRelayError: an internal error (the log could not be written).
	CodeRelayError = "RELAY_ERROR"
	// codeUnknownAgent: the recipient is neither registered here nor served
	// by a pinned peer (404; retryable, as it may register later).
	codeUnknownAgent = "UNKNOWN_AGENT"
)

// RetryableCode reports whether a failure with code may be retried with the
// same nonce: a new attempt is started instead of returning the cached
// failure.
func RetryableCode(code string) bool {
	switch code {
	case CodeOffline, CodeTimeout, CodeDeliveryFailed, codeDirectHTTPFailed, codeUnknownAgent:
		return true
	}
	return false
}

// RelayError is a relay failure as the sender sees it.
type RelayError struct {
	// Code is one of the Code* constants.
	Code string
	// Message says what went wrong, in words.
	Message string
	// Nonce is the frame's nonce when known.
	Nonce string
	// Result is the failure result frame recorded for the nonce, when the
	// failure was recorded; nil otherwise.
	Result []byte
	// RetryAfter is how long a RATE_LIMITED sender should wait.
	RetryAfter time.Duration
}

func (e *RelayError) Error() string {
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// HTTPStatus returns the status POST /intents/send answers with for e.
func (e *RelayError) HTTPStatus() int {
	return httpStatus(e.Code)
}

func httpStatus(code string) int {
	switch code {
	case codeInvalidJSON, CodeInvalidIntent, codeBadRequest, codeUnsupportedProtocol:
		return http.StatusBadRequest
	case CodeForbidden, CodeSenderSignatureRequired:
		return http.StatusForbidden
	case CodeInProgress, CodeNonceReuse:
		return http.StatusConflict
	case codeFrameTooLarge, codePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeOffline:
		return http.StatusServiceUnavailable
	case codeUnknownAgent:
		return http.StatusNotFound
	case codeRateLimited:
		return http.StatusTooManyRequests
	case CodeTimeout:
		return http.StatusGatewayTimeout
	case CodeDeliveryFailed, codeDirectHTTPFailed:
		return http.StatusBadGateway
	default:
		return http.StatusInternalServerError
	}
}

// httpErr returns e as the answer of POST /intents/send, in the Beam error
// shape, with Retry-After when e says how long to wait; e is its cause.
func (e *RelayError) httpErr() *httpjson.Error {
	he := &httpjson.Error{Status: e.HTTPStatus(), Code: e.Code, Message: e.Message, RetryAfter: e.RetryAfter, Err: e}
	switch e.Code {
	case CodeOffline:
		he.Message = "agent_offline"
		he.Fields = map[string]any{"message": e.Message, "nonce": e.Nonce}
	case codeBadRequest:
		// The reference reports every BAD_REQUEST of the relay as
		// INVALID_INTENT on HTTP; the precise code is kept as reason.
		he.Code = CodeInvalidIntent
		he.Fields = map[string]any{"reason": codeBadRequest}
	}
	return he
}

func relayErr(code, nonce, format string, args ...any) *RelayError {
	return &RelayError{Code: code, Nonce: nonce, Message: fmt.Sprintf(format, args...)}
}
