package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// MeshIntent is the intent type of a pipeline hop: the directory delivers
// the whole envelope (MeshEnvelope) as the frame's payload.
const MeshIntent = "mesh.envelope"

// The system actors every terminal envelope reaches. The gateway manages
// them; they may not appear in a route.
const (
	// MeshSink receives every terminal envelope, succeeded or failed.
	MeshSink = "x-sink"
	// MeshSump receives dead envelopes (failed, timed out, exhausted).
	MeshSump = "x-sump"
)

// MaxMeshEnvelopeBytes bounds an encoded envelope.
const MaxMeshEnvelopeBytes = 768 << 10

// Errors of the route rules.
var (
	ErrEmptyRoute    = errors.New("route is empty")
	ErrReservedActor = errors.New("x-sink and x-sump are managed by the gateway and may not appear in a route")
	ErrNotCurrent    = errors.New("only the current actor may rewrite next")
	ErrHopLimit      = errors.New("hop limit reached")
	ErrBadActor      = errors.New("actor name is empty or malformed")
)

// MeshRoute is the routing state of an envelope: the actors that processed
// it (prev), the one processing it (curr) and the ones still to come
// (next). Prev and curr are read-only; next is the current actor's to
// rewrite (RewriteNext).
type MeshRoute struct {
	Prev []string `json:"prev"`
	Curr string   `json:"curr"`
	Next []string `json:"next"`
}

// MeshStatus is the envelope's status member as actors see it.
type MeshStatus struct {
	Phase       string `json:"phase"`
	Actor       string `json:"actor,omitempty"`
	Attempt     int    `json:"attempt"`
	MaxAttempts int    `json:"max_attempts"`
	Reason      string `json:"reason,omitempty"`
	CreatedAt   string `json:"created_at"`
	UpdatedAt   string `json:"updated_at"`
	DeadlineAt  string `json:"deadline_at,omitempty"`
}

// MeshEnvelope is the unit a pipeline routes, as the gateway records it and
// delivers it to each actor: the Asya envelope's fields plus what Beam
// needs (the hop counter, the fan-out index and the authenticated creator).
type MeshEnvelope struct {
	ID       string            `json:"id"`
	ParentID string            `json:"parent_id,omitempty"`
	Route    MeshRoute         `json:"route"`
	Headers  map[string]string `json:"headers"`
	Status   MeshStatus        `json:"status"`
	Payload  json.RawMessage   `json:"payload"`
	// Hop counts the hops completed; FanoutIndex is the position of a
	// fan-out child among its siblings; Creator is the agent that created
	// the root envelope.
	Hop         int    `json:"hop"`
	FanoutIndex int    `json:"fanout_index,omitempty"`
	Creator     string `json:"creator"`
	// Author is the agent that chose route.curr and route.next: the actor
	// that last rewrote next ("" while the route is the creator's). Hops
	// are admitted by their actor's policy with Author as the sender.
	Author string `json:"author,omitempty"`
	// PrevActor is the author of the payload: the actor whose output it
	// is, or the creator when an onExhausted reroute or a requeue carries
	// the creator's payload on ("" while the payload is the creator's and
	// no actor has run). The envelope a hop delivers names it when an actor
	// ran or it is not the creator. The hop's frame is from it, or from the
	// creator.
	PrevActor string `json:"prev_actor,omitempty"`
}

// CheckMeshActor validates one actor name of a route: not a system actor,
// not empty, at most 256 bytes, no whitespace.
func CheckMeshActor(a string) error {
	switch {
	case a == MeshSink || a == MeshSump:
		return fmt.Errorf("%w: %q", ErrReservedActor, a)
	case a == "" || len(a) > 256 || strings.TrimSpace(a) != a || strings.ContainsAny(a, " \t\r\n"):
		return fmt.Errorf("%w: %q", ErrBadActor, a)
	}
	return nil
}

// NewMeshRoute builds the initial route of actors: curr is the first, next
// the rest. It refuses an empty list, reserved or malformed names, and
// more than maxHops actors.
func NewMeshRoute(actors []string, maxHops int) (MeshRoute, error) {
	if len(actors) == 0 {
		return MeshRoute{}, ErrEmptyRoute
	}
	if len(actors) > maxHops {
		return MeshRoute{}, fmt.Errorf("%w: %d actors, at most %d hops", ErrHopLimit, len(actors), maxHops)
	}
	for _, a := range actors {
		if err := CheckMeshActor(a); err != nil {
			return MeshRoute{}, err
		}
	}
	return MeshRoute{Prev: []string{}, Curr: actors[0], Next: append([]string{}, actors[1:]...)}, nil
}

// Done reports whether the route is exhausted (the envelope goes to x-sink).
func (r MeshRoute) Done() bool { return r.Curr == "" }

// Shift moves the route one hop on: curr joins prev, the first of next
// becomes curr (or "" at the end of the route). It never aliases r's slices.
func (r MeshRoute) Shift() MeshRoute {
	out := MeshRoute{Prev: make([]string, 0, len(r.Prev)+1), Next: []string{}}
	out.Prev = append(out.Prev, r.Prev...)
	if r.Curr != "" {
		out.Prev = append(out.Prev, r.Curr)
	}
	if len(r.Next) > 0 {
		out.Curr = r.Next[0]
		out.Next = append(out.Next, r.Next[1:]...)
	}
	return out
}

// RewriteNext replaces next with next on behalf of actor, which must be the
// current actor; prev and curr are read-only. hop is the number of hops
// done so far: the rewritten route may not take the envelope past maxHops.
func (r MeshRoute) RewriteNext(actor string, next []string, hop, maxHops int) (MeshRoute, error) {
	if actor == "" || actor != r.Curr {
		return r, fmt.Errorf("%w (current %q, asked by %q)", ErrNotCurrent, r.Curr, actor)
	}
	for _, a := range next {
		if err := CheckMeshActor(a); err != nil {
			return r, err
		}
	}
	if hop+1+len(next) > maxHops {
		return r, fmt.Errorf("%w: %d more hops after hop %d, at most %d", ErrHopLimit, len(next), hop+1, maxHops)
	}
	out := MeshRoute{Prev: append([]string{}, r.Prev...), Curr: r.Curr, Next: append([]string{}, next...)}
	return out, nil
}

// DecodeMeshEnvelope decodes and validates an envelope of at most
// MaxMeshEnvelopeBytes: one JSON object, payload valid JSON, and the rules
// of Check.
func DecodeMeshEnvelope(b []byte) (MeshEnvelope, error) {
	if len(b) > MaxMeshEnvelopeBytes {
		return MeshEnvelope{}, fmt.Errorf("envelope is %d bytes, more than %d", len(b), MaxMeshEnvelopeBytes)
	}
	var e MeshEnvelope
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&e); err != nil {
		return MeshEnvelope{}, fmt.Errorf("decode envelope: %w", err)
	}
	if dec.More() {
		return MeshEnvelope{}, errors.New("decode envelope: trailing data")
	}
	if len(e.Payload) == 0 || !json.Valid(e.Payload) {
		return MeshEnvelope{}, errors.New("envelope payload is not JSON")
	}
	if err := e.Check(); err != nil {
		return MeshEnvelope{}, err
	}
	return e, nil
}

// Check applies DecodeMeshEnvelope's rules apart from the payload's: an
// id, well formed route names (curr may be "" at the end of a route). Nil
// route lists and headers become empty ones.
func (e *MeshEnvelope) Check() error {
	if e.ID == "" {
		return errors.New("envelope without id")
	}
	for _, names := range [][]string{e.Route.Prev, e.Route.Next} {
		for _, a := range names {
			if err := CheckMeshActor(a); err != nil {
				return err
			}
		}
	}
	if e.Route.Curr != "" {
		if err := CheckMeshActor(e.Route.Curr); err != nil {
			return err
		}
	}
	if e.Route.Prev == nil {
		e.Route.Prev = []string{}
	}
	if e.Route.Next == nil {
		e.Route.Next = []string{}
	}
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	return nil
}
