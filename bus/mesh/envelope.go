package mesh

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/attempt"
)

// The system actors every terminal envelope reaches (wire.MeshSink and
// wire.MeshSump).
const (
	sink = wire.MeshSink
	sump = wire.MeshSump
)

// Headers the gateway manages and keeps across hops and retries.
const (
	headerTraceparent  = "traceparent"
	headerTracestate   = "tracestate"
	headerFirstAttempt = "x-asya-first-attempt"
	// headerMeshStatus "off" suppresses live status reporting (SSE) for the
	// envelope; its events are still recorded in the log.
	headerMeshStatus = "x-asya-mesh-status"
)

// defaultMaxHops bounds the hops of one envelope (a guard against routes
// that an actor keeps extending).
const defaultMaxHops = 100

// envelope, meshRoute and status are the pipeline envelope's wire types, which
// the Go SDK shares (agents/wire).
type (
	envelope  = wire.MeshEnvelope
	meshRoute = wire.MeshRoute
	status    = wire.MeshStatus
)

// Errors of the route rules (agents/wire).
var (
	errEmptyRoute    = wire.ErrEmptyRoute
	errReservedActor = wire.ErrReservedActor
	errNotCurrent    = wire.ErrNotCurrent
	errHopLimit      = wire.ErrHopLimit
	errBadActor      = wire.ErrBadActor
)

// progress is the route progress in percent once the current actor of r
// has completed: (len(prev)+1) / (len(prev)+1+len(next)) * 100. It is
// clamped to never fall below prev, since a rewritten next may lengthen the
// route.
func progress(prev float64, r meshRoute) float64 {
	done := float64(len(r.Prev) + 1)
	p := done / (done + float64(len(r.Next))) * 100
	return max(prev, min(p, 100))
}

// routeAuthor is the agent that chose the envelope's current route: the
// actor that last rewrote next, or the creator.
func routeAuthor(e envelope) string {
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
func contentAuthor(e envelope) string {
	if e.PrevActor != "" {
		return e.PrevActor
	}
	if n := len(e.Route.Prev); n > 0 {
		return e.Route.Prev[n-1]
	}
	return e.Creator
}

// maxEnvelopeBytes bounds an encoded envelope.
const maxEnvelopeBytes = wire.MaxMeshEnvelopeBytes

// decodeEnvelope decodes and validates an envelope (wire.DecodeMeshEnvelope).
func decodeEnvelope(b []byte) (envelope, error) { return wire.DecodeMeshEnvelope(b) }

// encodeEnvelope returns the envelope as JSON as encoding/json writes it
// with HTML escaping off (the payload compacted). The payload must be valid
// JSON.
func encodeEnvelope(e envelope) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		// Every field is a string, number or valid raw JSON.
		panic(fmt.Sprintf("encode envelope: %v", err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// cloneEnvelope returns a deep copy of e (the payload bytes are shared; they are
// never modified).
func cloneEnvelope(e envelope) envelope {
	c := e
	c.Route = meshRoute{Prev: append([]string{}, e.Route.Prev...), Curr: e.Route.Curr, Next: append([]string{}, e.Route.Next...)}
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
		case headerTraceparent, headerTracestate, headerFirstAttempt:
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

// duration is a time.Duration written as a Go duration string ("250ms").
type duration time.Duration

// MarshalJSON writes the duration as a string.
func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string or a number of milliseconds.
func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 {
			return fmt.Errorf("duration %q: want a non-negative Go duration", s)
		}
		*d = duration(v)
		return nil
	}
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil || ms < 0 {
		return fmt.Errorf("duration %s: want a string or non-negative milliseconds", b)
	}
	*d = duration(time.Duration(ms * float64(time.Millisecond)))
	return nil
}

// Backoff kinds of a Policy.
const (
	backoffConstant    = "constant"
	backoffLinear      = "linear"
	backoffExponential = "exponential"
)

// Policy is an actor's retry policy.
type Policy struct {
	// MaxAttempts counts the first attempt (1: no retry).
	MaxAttempts int `json:"maxAttempts"`
	// Backoff is constant, linear or exponential (default exponential).
	Backoff string `json:"backoff,omitempty"`
	// InitialDelay is the delay before the second attempt.
	InitialDelay duration `json:"initialDelay,omitempty"`
	// MaxInterval caps one delay (0: no cap).
	MaxInterval duration `json:"maxInterval,omitempty"`
	// MaxDuration bounds the time since the hop's first attempt
	// (x-asya-first-attempt) within which retries are made (0: no bound).
	MaxDuration duration `json:"maxDuration,omitempty"`
	// Jitter spreads each delay by ±50%.
	Jitter bool `json:"jitter,omitempty"`
	// OnExhausted, when set, replaces next with these actors once the
	// attempts are used up, instead of failing the envelope.
	OnExhausted []string `json:"onExhausted,omitempty"`
}

// defaultPolicy is the policy of actors without one: a single attempt.
var defaultPolicy = Policy{MaxAttempts: 1, Backoff: backoffExponential, InitialDelay: duration(100 * time.Millisecond)}

// Validate checks p.
func (p Policy) Validate() error {
	switch p.Backoff {
	case "", backoffConstant, backoffLinear, backoffExponential:
	default:
		return fmt.Errorf("policy backoff %q: want constant, linear or exponential", p.Backoff)
	}
	if p.MaxAttempts < 1 || p.MaxAttempts > 1000 {
		return fmt.Errorf("policy maxAttempts %d: want 1 to 1000", p.MaxAttempts)
	}
	for _, a := range p.OnExhausted {
		if err := wire.CheckMeshActor(a); err != nil {
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
	case backoffConstant:
		b.Growth = attempt.Constant
	case backoffLinear:
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
	reasonMaxRetries   = "MaxRetriesExhausted"
	reasonMaxDuration  = "MaxDurationExhausted"
	reasonNonRetryable = "NonRetryableFailure"
	reasonTimeout      = "Timeout"
	reasonHopLimit     = "HopLimit"
	reasonPolicyRouted = "PolicyRouted"
	reasonCanceled     = "Canceled"
	reasonBadReply     = "ParseError"
)

// reasons are the wire's reasons of the attempt engine's.
var reasons = map[attempt.Reason]string{
	attempt.Exhausted:    reasonMaxRetries,
	attempt.OutOfTime:    reasonMaxDuration,
	attempt.NotRetryable: reasonNonRetryable,
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
