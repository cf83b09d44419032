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

// nStates is the number of canonical states.
const nStates = 8

// States lists every canonical state in lifecycle order.
var States = []State{Received, Validated, Queued, Dispatched, Delivered, Acked, Failed, DeadLetter}

// IntentLifecycle is the canonical lifecycle of an intent, as data: every
// nonce's events follow it, whatever its owner (the owners' own tables come
// on top). A state may follow itself (an annotation such as a second
// federation hop or a late result recorded after a failure) unless it is
// acked, which is final.
var IntentLifecycle = Register(&Lifecycle{
	Name:    "intent",
	Owner:   OwnerDirectory,
	Package: "tracing",
	Doc: "The canonical lifecycle every nonce of the log follows, whatever its owner; the owners' tables below " +
		"come on top of it. The directory relays intents along it.",
	Checked:  "the log's writer, on every append (CanTransition, whatever the owner)",
	States:   Names(States),
	Terminal: Names([]State{Acked, Failed, DeadLetter}),
	Repeat:   Names([]State{Received, Validated, Queued, Dispatched, Delivered, Failed, DeadLetter}),
	Transitions: []Transition{
		{"", "received", ""},
		{"received", "validated", ""}, {"received", "dispatched", ""}, {"received", "queued", ""},
		{"received", "failed", ""}, {"received", "dead_letter", ""},
		{"validated", "queued", ""}, {"validated", "dispatched", ""}, {"validated", "failed", ""},
		{"validated", "dead_letter", ""},
		{"queued", "dispatched", ""}, {"queued", "failed", ""}, {"queued", "dead_letter", ""},
		{"dispatched", "delivered", ""}, {"dispatched", "queued", ""}, {"dispatched", "failed", ""},
		{"dispatched", "dead_letter", ""},
		{"delivered", "acked", ""}, {"delivered", "failed", ""}, {"delivered", "queued", ""},
		{"delivered", "dead_letter", ""},
		{"failed", "queued", ""},
		{"dead_letter", "queued", ""},
	},
})

// canonical is IntentLifecycle as a matrix indexed by stateIndex+1 (0 is
// the empty state), so that CanTransition costs two lookups per event.
var canonical = func() (m [nStates + 1][nStates + 1]bool) {
	idx := func(s string) int {
		if s == "" {
			return 0
		}
		return stateIndex(State(s)) + 1
	}
	for _, from := range append([]string{""}, IntentLifecycle.States...) {
		for _, to := range IntentLifecycle.States {
			m[idx(from)][idx(to)] = IntentLifecycle.Allows(from, to, "")
		}
	}
	return m
}()

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
	t := stateIndex(to)
	if t < 0 {
		return false
	}
	f := 0
	if from != "" {
		if f = stateIndex(from) + 1; f == 0 {
			return false
		}
	}
	return canonical[f][t+1]
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
