package tracing

import (
	"fmt"
	"slices"
)

// State is a canonical lifecycle state of an intent. Every transport (HTTP,
// WebSocket, federation, the bus) records the same states; transport-specific
// labels go into an event's details, never into new states.
type State string

// The canonical lifecycle states.
const (
	Received   State = "received"
	Validated  State = "validated"
	Queued     State = "queued"
	Dispatched State = "dispatched"
	Delivered  State = "delivered"
	Acked      State = "acked"
	Failed     State = "failed"
	DeadLetter State = "dead_letter"
)

// States lists every canonical state in lifecycle order.
var States = []State{Received, Validated, Queued, Dispatched, Delivered, Acked, Failed, DeadLetter}

// transitions is the lifecycle transition table: for each state, the states
// that may follow it. The empty state stands for "no event yet". Self
// transitions are handled by CanTransition and are not listed here.
var transitions = map[State][]State{
	"":         {Received},
	Received:   {Validated, Dispatched, Queued, Failed, DeadLetter},
	Validated:  {Queued, Dispatched, Failed, DeadLetter},
	Queued:     {Dispatched, Failed, DeadLetter},
	Dispatched: {Delivered, Queued, Failed, DeadLetter},
	Delivered:  {Acked, Failed, Queued, DeadLetter},
	Failed:     {Queued},
	DeadLetter: {Queued},
	Acked:      nil,
}

// Valid reports whether s is one of the canonical states.
func (s State) Valid() bool {
	return slices.Contains(States, s)
}

// ParseState returns the canonical state named by s, or an error naming the
// unknown label.
func ParseState(s string) (State, error) {
	st := State(s)
	if !st.Valid() {
		return "", fmt.Errorf("unknown lifecycle state %q", s)
	}
	return st, nil
}

// CanTransition reports whether an intent in state from may move to state to.
// from is "" for an intent that has no event yet. A state may follow itself
// (an annotation such as a second federation hop or a late result recorded
// after a failure) unless it is acked, which is terminal.
func CanTransition(from, to State) bool {
	if !to.Valid() || (from != "" && !from.Valid()) {
		return false
	}
	if from != "" && from == to {
		return from != Acked
	}
	return slices.Contains(transitions[from], to)
}

// Terminal reports whether s ends the lifecycle: acked always; failed and
// dead_letter end it unless a retry or an operator requeue moves the intent
// back to queued.
func (s State) Terminal() bool {
	return s == Acked || s == Failed || s == DeadLetter
}

// Bucket is a derived outcome used by the dashboard and the metrics.
type Bucket string

// The outcome buckets.
const (
	BucketSuccess  Bucket = "success"
	BucketError    Bucket = "error"
	BucketInFlight Bucket = "in_flight"
)

// Bucket returns the outcome bucket of s: success for acked, error for failed
// and dead_letter, in_flight for everything else.
func (s State) Bucket() Bucket {
	switch s {
	case Acked:
		return BucketSuccess
	case Failed, DeadLetter:
		return BucketError
	default:
		return BucketInFlight
	}
}

// TransitionError is returned for an event whose state may not follow the
// intent's current state. Nothing of the rejected append is written.
type TransitionError struct {
	Nonce string
	From  State
	To    State
}

func (e *TransitionError) Error() string {
	from := string(e.From)
	if from == "" {
		from = "(new)"
	}
	return fmt.Sprintf("illegal lifecycle transition for nonce %q: %s -> %s", e.Nonce, from, e.To)
}
