package mesh

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/beamdir/beam/attempt"
)

// The system actors every terminal envelope reaches. They are managed by
// the gateway and may not appear in a route.
const (
	// Sink receives every terminal envelope, succeeded or failed.
	Sink = "x-sink"
	// Sump receives dead envelopes (failed, timed out, exhausted).
	Sump = "x-sump"
)

// Headers the gateway manages and keeps across hops and retries.
const (
	HeaderTraceparent  = "traceparent"
	HeaderTracestate   = "tracestate"
	HeaderFirstAttempt = "x-asya-first-attempt"
	// HeaderMeshStatus "off" suppresses live status reporting (SSE) for the
	// envelope; its events are still recorded in the log.
	HeaderMeshStatus = "x-asya-mesh-status"
)

// DefaultMaxHops bounds the hops of one envelope (a guard against routes
// that an actor keeps extending).
const DefaultMaxHops = 100

// Route is the routing state of an envelope: the actors that processed it,
// the one processing it, and the ones still to come.
type Route struct {
	Prev []string `json:"prev"`
	Curr string   `json:"curr"`
	Next []string `json:"next"`
}

// Done reports whether the route is exhausted (the envelope goes to x-sink).
func (r Route) Done() bool { return r.Curr == "" }

// Shift moves the route one hop on: curr joins prev, the first of next
// becomes curr (or "" at the end of the route). It never aliases r's slices.
func (r Route) Shift() Route {
	out := Route{Prev: make([]string, 0, len(r.Prev)+1), Next: []string{}}
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

// Errors of the route rules.
var (
	ErrEmptyRoute    = errors.New("route is empty")
	ErrReservedActor = errors.New("x-sink and x-sump are managed by the gateway and may not appear in a route")
	ErrNotCurrent    = errors.New("only the current actor may rewrite next")
	ErrHopLimit      = errors.New("hop limit reached")
	ErrBadActor      = errors.New("actor name is empty or malformed")
)

// checkActor validates one actor name of a route.
func checkActor(a string) error {
	switch {
	case a == Sink || a == Sump:
		return fmt.Errorf("%w: %q", ErrReservedActor, a)
	case a == "" || len(a) > 256 || strings.TrimSpace(a) != a || strings.ContainsAny(a, " \t\r\n"):
		return fmt.Errorf("%w: %q", ErrBadActor, a)
	}
	return nil
}

// NewRoute builds the initial route of actors: curr is the first, next the
// rest. It refuses an empty list, reserved or malformed names, and more
// than maxHops actors.
func NewRoute(actors []string, maxHops int) (Route, error) {
	if len(actors) == 0 {
		return Route{}, ErrEmptyRoute
	}
	if len(actors) > maxHops {
		return Route{}, fmt.Errorf("%w: %d actors, at most %d hops", ErrHopLimit, len(actors), maxHops)
	}
	for _, a := range actors {
		if err := checkActor(a); err != nil {
			return Route{}, err
		}
	}
	return Route{Prev: []string{}, Curr: actors[0], Next: append([]string{}, actors[1:]...)}, nil
}

// RewriteNext replaces next with next on behalf of actor, which must be the
// current actor; prev and curr are read-only. hop is the number of hops
// done so far: the rewritten route may not take the envelope past maxHops.
func (r Route) RewriteNext(actor string, next []string, hop, maxHops int) (Route, error) {
	if actor == "" || actor != r.Curr {
		return r, fmt.Errorf("%w (current %q, asked by %q)", ErrNotCurrent, r.Curr, actor)
	}
	for _, a := range next {
		if err := checkActor(a); err != nil {
			return r, err
		}
	}
	if hop+1+len(next) > maxHops {
		return r, fmt.Errorf("%w: %d more hops after hop %d, at most %d", ErrHopLimit, len(next), hop+1, maxHops)
	}
	out := Route{Prev: append([]string{}, r.Prev...), Curr: r.Curr, Next: append([]string{}, next...)}
	return out, nil
}

// Progress is the route progress in percent once the current actor of r
// has completed: (len(prev)+1) / (len(prev)+1+len(next)) * 100. It is
// clamped to never fall below prev, since a rewritten next may lengthen the
// route.
func Progress(prev float64, r Route) float64 {
	done := float64(len(r.Prev) + 1)
	p := done / (done + float64(len(r.Next))) * 100
	return max(prev, min(p, 100))
}

// Status is the envelope's status member as actors see it.
type Status struct {
	Phase       string `json:"phase"`
	Actor       string `json:"actor,omitempty"`
	Attempt     int    `json:"attempt"`
	MaxAttempts int    `json:"max_attempts"`
	Reason      string `json:"reason,omitempty"`
	CreatedAt   string `json:"created_at"`
	UpdatedAt   string `json:"updated_at"`
	DeadlineAt  string `json:"deadline_at,omitempty"`
}

// Envelope is the unit a pipeline routes: the seed's fields plus what Beam
// needs (the hop counter, the fan-out index and the authenticated creator).
type Envelope struct {
	ID       string            `json:"id"`
	ParentID string            `json:"parent_id,omitempty"`
	Route    Route             `json:"route"`
	Headers  map[string]string `json:"headers"`
	Status   Status            `json:"status"`
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

// routeAuthor is the agent that chose the envelope's current route: the
// actor that last rewrote next, or the creator.
func (e Envelope) routeAuthor() string {
	if e.Author != "" {
		return e.Author
	}
	return e.Creator
}

// contentAuthor is the agent whose output the envelope's payload is:
// prev_actor, which every hop's outcome records (an actor that fails keeps
// it: a reroute carries on what it was given); the last actor of
// route.prev for an envelope recorded without it; or the creator before
// the first hop.
func (e Envelope) contentAuthor() string {
	if e.PrevActor != "" {
		return e.PrevActor
	}
	if n := len(e.Route.Prev); n > 0 {
		return e.Route.Prev[n-1]
	}
	return e.Creator
}

// MaxEnvelopeBytes bounds an encoded envelope.
const MaxEnvelopeBytes = 768 << 10

// DecodeEnvelope decodes and validates an envelope: id and creator
// present, payload valid JSON, route names well formed (curr may be "" at
// the end of a route).
func DecodeEnvelope(b []byte) (Envelope, error) {
	if len(b) > MaxEnvelopeBytes {
		return Envelope{}, fmt.Errorf("envelope is %d bytes, more than %d", len(b), MaxEnvelopeBytes)
	}
	var e Envelope
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&e); err != nil {
		return Envelope{}, fmt.Errorf("decode envelope: %w", err)
	}
	if dec.More() {
		return Envelope{}, errors.New("decode envelope: trailing data")
	}
	if len(e.Payload) == 0 || !json.Valid(e.Payload) {
		return Envelope{}, errors.New("envelope payload is not JSON")
	}
	if err := e.check(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// check applies DecodeEnvelope's rules apart from the payload's: an id, well
// formed route names; nil route lists and headers become empty ones.
func (e *Envelope) check() error {
	if e.ID == "" {
		return errors.New("envelope without id")
	}
	for _, names := range [][]string{e.Route.Prev, e.Route.Next} {
		for _, a := range names {
			if err := checkActor(a); err != nil {
				return err
			}
		}
	}
	if e.Route.Curr != "" {
		if err := checkActor(e.Route.Curr); err != nil {
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

// Encode returns the envelope as JSON (the payload compacted), byte for
// byte as encoding/json writes it with HTML escaping off.
func (e Envelope) Encode() json.RawMessage {
	b, err := appendEnvelope(make([]byte, 0, 512+len(e.Payload)), e)
	if err != nil {
		// Every field is a string, number or valid raw JSON.
		panic(fmt.Sprintf("encode envelope: %v", err))
	}
	return b
}

// clone returns a deep copy of e (the payload bytes are shared; they are
// never modified).
func (e Envelope) clone() Envelope {
	c := e
	c.Route = Route{Prev: append([]string{}, e.Route.Prev...), Curr: e.Route.Curr, Next: append([]string{}, e.Route.Next...)}
	c.Headers = make(map[string]string, len(e.Headers))
	for k, v := range e.Headers {
		c.Headers[k] = v
	}
	return c
}

// mergeHeaders applies an actor's header changes, keeping the headers the
// gateway manages.
func mergeHeaders(cur, changes map[string]string) map[string]string {
	out := make(map[string]string, len(cur)+len(changes))
	for k, v := range cur {
		out[k] = v
	}
	for k, v := range changes {
		switch strings.ToLower(k) {
		case HeaderTraceparent, HeaderTracestate, HeaderFirstAttempt:
			continue
		}
		if v == "" {
			delete(out, k)
			continue
		}
		out[k] = v
	}
	return out
}

// Duration is a time.Duration written as a Go duration string ("250ms").
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string or a number of milliseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 {
			return fmt.Errorf("duration %q: want a non-negative Go duration", s)
		}
		*d = Duration(v)
		return nil
	}
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil || ms < 0 {
		return fmt.Errorf("duration %s: want a string or non-negative milliseconds", b)
	}
	*d = Duration(time.Duration(ms * float64(time.Millisecond)))
	return nil
}

// Backoff kinds of a Policy.
const (
	BackoffConstant    = "constant"
	BackoffLinear      = "linear"
	BackoffExponential = "exponential"
)

// Policy is an actor's retry policy.
type Policy struct {
	// MaxAttempts counts the first attempt (1: no retry).
	MaxAttempts int `json:"maxAttempts"`
	// Backoff is constant, linear or exponential (default exponential).
	Backoff string `json:"backoff,omitempty"`
	// InitialDelay is the delay before the second attempt.
	InitialDelay Duration `json:"initialDelay,omitempty"`
	// MaxInterval caps one delay (0: no cap).
	MaxInterval Duration `json:"maxInterval,omitempty"`
	// MaxDuration bounds the time since the hop's first attempt
	// (x-asya-first-attempt) within which retries are made (0: no bound).
	MaxDuration Duration `json:"maxDuration,omitempty"`
	// Jitter spreads each delay by ±50%.
	Jitter bool `json:"jitter,omitempty"`
	// OnExhausted, when set, replaces next with these actors once the
	// attempts are used up, instead of failing the envelope.
	OnExhausted []string `json:"onExhausted,omitempty"`
}

// DefaultPolicy is the policy of actors without one: a single attempt.
var DefaultPolicy = Policy{MaxAttempts: 1, Backoff: BackoffExponential, InitialDelay: Duration(100 * time.Millisecond)}

// Validate checks p.
func (p Policy) Validate() error {
	switch p.Backoff {
	case "", BackoffConstant, BackoffLinear, BackoffExponential:
	default:
		return fmt.Errorf("policy backoff %q: want constant, linear or exponential", p.Backoff)
	}
	if p.MaxAttempts < 1 || p.MaxAttempts > 1000 {
		return fmt.Errorf("policy maxAttempts %d: want 1 to 1000", p.MaxAttempts)
	}
	for _, a := range p.OnExhausted {
		if err := checkActor(a); err != nil {
			return fmt.Errorf("policy onExhausted: %w", err)
		}
	}
	return nil
}

// backoff maps p's delays onto the attempt engine: jitter spreads each
// delay by ±50 %.
func (p Policy) backoff() attempt.Backoff {
	b := attempt.Backoff{Growth: attempt.Exponential, Initial: time.Duration(p.InitialDelay), Max: time.Duration(p.MaxInterval)}
	switch p.Backoff {
	case BackoffConstant:
		b.Growth = attempt.Constant
	case BackoffLinear:
		b.Growth = attempt.Linear
	}
	if p.Jitter {
		b.Jitter = 0.5
	}
	return b
}

// Delay returns the wait before attempt n+1 after attempt n failed; u in [0,1)
// is the jitter draw (ignored unless Jitter).
func (p Policy) Delay(n int, u float64) time.Duration {
	return p.backoff().Delay(n, u)
}

// Exhaustion reasons.
const (
	ReasonMaxRetries   = "MaxRetriesExhausted"
	ReasonMaxDuration  = "MaxDurationExhausted"
	ReasonNonRetryable = "NonRetryableFailure"
	ReasonTimeout      = "Timeout"
	ReasonHopLimit     = "HopLimit"
	ReasonPolicyRouted = "PolicyRouted"
	ReasonCanceled     = "Canceled"
	ReasonBadReply     = "ParseError"
)

// reasons are the wire's reasons of the attempt engine's.
var reasons = map[attempt.Reason]string{
	attempt.Exhausted:    ReasonMaxRetries,
	attempt.OutOfTime:    ReasonMaxDuration,
	attempt.NotRetryable: ReasonNonRetryable,
}

// Retry decides what follows failed attempt number n (1-based) of a hop
// first tried at first: retry after the returned delay, or stop with a
// reason.
func (p Policy) Retry(n int, retryable bool, first, now time.Time, u float64) (time.Duration, string) {
	pol := attempt.Policy{Backoff: p.backoff(), MaxAttempts: p.MaxAttempts, MaxDuration: time.Duration(p.MaxDuration)}
	v := pol.Decide(attempt.Failure{N: n, Retryable: retryable, First: first, Now: now, Draw: u})
	if v.Retry {
		return v.Delay, ""
	}
	return 0, reasons[v.Reason]
}

// PolicyFile is the JSON file of `beam serve --mesh-policies`: the default
// policy and the policies of named actors.
type PolicyFile struct {
	Default *Policy           `json:"default,omitempty"`
	Actors  map[string]Policy `json:"actors,omitempty"`
}

// ParsePolicyFile decodes and validates a policy file's contents.
func ParsePolicyFile(b []byte) (PolicyFile, error) {
	var f PolicyFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return PolicyFile{}, fmt.Errorf("mesh policies: %w", err)
	}
	if f.Default != nil {
		if err := f.Default.Validate(); err != nil {
			return PolicyFile{}, fmt.Errorf("mesh policies: default: %w", err)
		}
	}
	for a, p := range f.Actors {
		if err := p.Validate(); err != nil {
			return PolicyFile{}, fmt.Errorf("mesh policies: %s: %w", a, err)
		}
	}
	return f, nil
}
