package tracing

import (
	"errors"
	"fmt"
)

// errClosed is returned by Append, Do, Rebuild and Ping after Close, and
// reported by subscriptions that were open when the log closed.
var errClosed = errors.New("tracing: log closed")

// ErrSubscriberLagged ends a subscription whose buffer overflowed because
// its reader fell behind the writer. The reader resumes by subscribing again
// from the last seq it saw.
var ErrSubscriberLagged = errors.New("tracing: subscriber lagged behind the log")

// ValidationError rejects an event that is malformed regardless of the
// nonce's current state: an unknown state, a missing or oversized nonce, a
// first event without From/To/IntentType, details that cannot be encoded, a
// duplicate bus message id, or a call with too many events. Nothing of the
// rejected call is written.
type ValidationError struct {
	// Nonce of the offending event (may be empty or truncated when the nonce
	// itself is the problem).
	Nonce string
	// Index of the offending event within the call.
	Index int
	// Field names what is wrong, e.g. "state", "nonce", "from", "details".
	Field string
	// Reason says why, in words.
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid event %d (nonce %q): %s: %s", e.Index, e.Nonce, e.Field, e.Reason)
}

// FuncError wraps the error returned by the function passed to Log.Do. The
// request was rejected and none of its events were written.
type FuncError struct {
	Err error
}

func (e *FuncError) Error() string { return "log transaction function: " + e.Err.Error() }

// Unwrap returns the function's error.
func (e *FuncError) Unwrap() error { return e.Err }
