package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
	"github.com/google/uuid"
)

// Error codes of the gateway and of failed envelopes.
const (
	codeInvalidJSON     = "INVALID_JSON"
	codeEmptyRoute      = "EMPTY_ROUTE"
	codeReservedActor   = "RESERVED_ACTOR"
	codeUnknownActor    = "UNKNOWN_ACTOR"
	codeHopLimit        = "HOP_LIMIT"
	codePayloadTooLarge = "PAYLOAD_TOO_LARGE"
	codeInvalidField    = "INVALID_FIELD"
	codeUnauthorized    = "UNAUTHORIZED"
	codeForbidden       = "FORBIDDEN"
	codeNotFound        = "NOT_FOUND"
	codeConflict        = "CONFLICT"
	codeCanceled        = "CANCELED"
	codeTimeout         = "TIMEOUT"
	// codeRateLimited: the creating agent created envelopes faster than
	// the gateway's rate (429, Retry-After).
	codeRateLimited = "RATE_LIMITED"
	// codeTooManyOpen: the creating agent has as many open envelopes as
	// the gateway allows one creator (429, Retry-After).
	codeTooManyOpen = "TOO_MANY_OPEN_ENVELOPES"
	// codePermanent is the error code an actor answers with for a failure
	// no retry can fix; every other failure is retried by the policy.
	codePermanent = "MESH_PERMANENT"
)

// nonRetryable are actor error codes that are never retried.
var nonRetryable = map[string]bool{codePermanent: true, "UNSUPPORTED_INTENT": true, "INVALID_INTENT": true}

// CreateRequest is a validated request for a new envelope.
type CreateRequest struct {
	Creator string
	Route   []string
	Payload json.RawMessage
	Headers map[string]string
	Timeout time.Duration
	// ParentID and Prev are set by an operator requeue: the dead envelope
	// and the actors it went through, which the new envelope's route.prev
	// keeps.
	ParentID string
	Prev     []string
	// Author and ContentAuthor are set by an operator requeue: the agent
	// that chose the route the requeued envelope goes on with (its hops
	// are admitted with it as the sender), and the author of the payload
	// ("": the creator's).
	Author, ContentAuthor string
}

// routeErr maps a route rule error to a client mistake.
func routeErr(err error) *httpjson.Error {
	switch {
	case errors.Is(err, errEmptyRoute):
		return httpjson.Errorf(http.StatusBadRequest, codeEmptyRoute, "%v", err)
	case errors.Is(err, errReservedActor):
		return httpjson.Errorf(http.StatusBadRequest, codeReservedActor, "%v", err)
	case errors.Is(err, errHopLimit):
		return httpjson.Errorf(http.StatusBadRequest, codeHopLimit, "%v", err)
	default:
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "route: %v", err)
	}
}

// Create records a new envelope and starts its first hop. Errors are
// *httpjson.Error for client mistakes.
func (e *Engine) Create(ctx context.Context, req CreateRequest) (tracing.MeshRow, error) {
	route, err := wire.NewMeshRoute(req.Route, e.cfg.MaxHops)
	if err != nil {
		return tracing.MeshRow{}, routeErr(err)
	}
	for _, a := range req.Route {
		if !e.known(a) {
			return tracing.MeshRow{}, httpjson.Errorf(http.StatusBadRequest, codeUnknownActor,
				"actor %q is neither a registered agent nor served by a pinned peer directory", a)
		}
	}
	if _, ok := e.reg.Get(req.Creator); !ok {
		return tracing.MeshRow{}, httpjson.Errorf(http.StatusBadRequest, codeUnknownActor, "creator %q is not a registered agent", req.Creator)
	}
	payload := bytes.TrimSpace(req.Payload)
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	if !json.Valid(payload) {
		return tracing.MeshRow{}, httpjson.Errorf(http.StatusBadRequest, codeInvalidJSON, "payload is not valid JSON")
	}
	if len(payload) > e.cfg.MaxPayloadBytes {
		return tracing.MeshRow{}, httpjson.Errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge,
			"payload is %d bytes, at most %d", len(payload), e.cfg.MaxPayloadBytes)
	}
	if req.Prev != nil {
		if len(req.Prev)+len(req.Route) > e.cfg.MaxHops {
			return tracing.MeshRow{}, routeErr(fmt.Errorf("%w: %d actors, at most %d hops", errHopLimit, len(req.Prev)+len(req.Route), e.cfg.MaxHops))
		}
		route.Prev = append([]string{}, req.Prev...)
	}
	timeout := req.Timeout
	if timeout == 0 {
		// The gateway's hard limit; the envelope's status names no
		// deadline the creator did not ask for.
		timeout = e.cfg.DefaultTimeout
	}
	if timeout < 0 || timeout > e.cfg.MaxTimeout {
		return tracing.MeshRow{}, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "timeout must be between 0 and %s", e.cfg.MaxTimeout)
	}
	headers := map[string]string{}
	for k, v := range req.Headers {
		if k == headerFirstAttempt {
			continue
		}
		if len(k) > 256 || len(v) > 4096 || len(headers) >= 64 {
			return tracing.MeshRow{}, httpjson.Errorf(http.StatusBadRequest, codeInvalidField, "headers: at most 64, names up to 256 and values up to 4096 bytes")
		}
		headers[k] = v
	}
	if !validTraceparent(headers[headerTraceparent]) {
		headers[headerTraceparent] = newTraceparent()
	}
	now := e.cfg.Clock().UTC()
	deadline := now.Add(timeout)
	env := envelope{
		ID: uuid.NewString(), ParentID: req.ParentID, Route: route, Headers: headers, Payload: payload, Creator: req.Creator,
		Author: req.Author, Status: status{Phase: string(tracing.MeshPending), Actor: route.Curr, CreatedAt: rfc3339(now), UpdatedAt: rfc3339(now)},
	}
	if req.Timeout > 0 {
		env.Status.DeadlineAt = rfc3339(deadline)
	}
	// The payload's author is named whenever the kept route.prev would
	// name another (contentAuthor falls back to its last actor).
	if req.ContentAuthor != "" && req.ContentAuthor != contentAuthor(env) {
		env.PrevActor = req.ContentAuthor
	}
	row := tracing.MeshRow{ID: env.ID, Nonce: nonceOf(env.ID)}
	created := tracing.Event{Nonce: row.Nonce, State: tracing.Received, From: req.Creator, To: route.Curr,
		IntentType: intentEnvelope, Transport: "mesh", Details: tracing.Details{Owner: tracing.OwnerMesh,
			Mesh: tracing.MeshStep{Kind: tracing.MeshKindCreated, ID: env.ID, ParentID: req.ParentID, Creator: req.Creator,
				DeadlineAt: deadline.UnixMilli(), Status: tracing.MeshPending, Envelope: encodeStored(env), Actor: route.Curr}.Encode()}}
	queued := e.event(row, tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait})
	if err := e.append(ctx, nil, created, queued); err != nil {
		return tracing.MeshRow{}, fmt.Errorf("record envelope: %w", err)
	}
	e.m.created.Inc()
	out, _, err := e.log.MeshEnvelope(ctx, env.ID)
	if err != nil {
		return tracing.MeshRow{}, err
	}
	e.startAttempt(env.ID)
	return out, nil
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// envelopeOf decodes row's envelope and refreshes its status member.
func envelopeOf(row tracing.MeshRow) (envelope, error) {
	env, err := envelopes.decode(row.Envelope)
	if err != nil {
		return envelope{}, err
	}
	env.Status.Phase = string(row.Status)
	env.Status.Attempt = row.Attempt
	if row.Actor != "" {
		env.Status.Actor = row.Actor
	}
	env.Status.Reason = row.Reason
	env.Status.UpdatedAt = rfc3339(time.UnixMicro(row.UpdatedAt))
	return env, nil
}

// attempt starts the next delivery of envelope id when it is queued, due,
// not paused and not finished.
func (e *Engine) attempt(ctx context.Context, id string) error {
	unlock := e.lock(id)
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	now := e.cfg.Clock()
	if err != nil || !ok || row.Status.Terminal() || row.Status == tracing.MeshPaused || row.State != tracing.Queued ||
		(row.NextAt > now.UnixMilli() && !e.woken(id, row.Actor)) {
		unlock()
		return err
	}
	if taken, err := e.log.Unadopted(ctx, row.Nonce); err != nil || taken {
		unlock() // a takeover's, until it adopts the envelope (Adopt)
		return err
	}
	env, err := envelopeOf(row)
	if err != nil {
		err = e.fail(ctx, row, envelope{ID: id, Payload: json.RawMessage("{}")}, nil, reasonBadReply, "stored envelope: "+err.Error(), codePermanent)
		unlock()
		return err
	}
	if row.DeadlineAt > 0 && now.UnixMilli() >= row.DeadlineAt {
		err := e.fail(ctx, row, env, nil, reasonTimeout, "the envelope's deadline passed before the hop", codeTimeout)
		unlock()
		return err
	}
	actor := env.Route.Curr
	agent, okA := e.reg.Get(actor)
	creator, okC := e.reg.Get(env.Creator)
	peer, remote := e.dir.PeerFor(actor)
	if (!okA && !remote) || !okC {
		err := e.fail(ctx, row, env, nil, reasonNonRetryable, fmt.Sprintf("actor %q or creator %q is no longer registered", actor, env.Creator), codeUnknownActor)
		unlock()
		return err
	}
	if code, msg := e.admit(env, actor, remote); code != "" {
		err := e.fail(ctx, row, env, nil, reasonNonRetryable, msg, code)
		unlock()
		return err
	}
	n := row.Attempt + 1
	transport := directory.TransportWS
	var peerNonce string
	var peerFrame *wire.IntentFrame
	switch {
	case remote:
		transport = directory.TransportFederation
		if peerNonce, peerFrame, err = e.peerHop(ctx, row, n); err != nil {
			unlock()
			return err
		}
	default:
		online, waiting := e.online(id, actor)
		if online {
			break
		}
		if agent.HTTPEndpoint == "" {
			err := e.waitForActor(ctx, row, actor, waiting, now)
			unlock()
			return err
		}
		e.stopWaiting(id, actor)
		transport = directory.TransportDirectHTTP
	}
	first := row.FirstAttemptAt
	if first == 0 {
		first = now.UnixMilli()
	}
	pol := e.policy(actor)
	env.Headers[headerFirstAttempt] = rfc3339(time.UnixMilli(first))
	env.Status = status{Phase: "processing", Actor: actor, Attempt: n, MaxAttempts: pol.MaxAttempts,
		CreatedAt: rfc3339(time.UnixMicro(row.CreatedAt)), UpdatedAt: rfc3339(now), DeadlineAt: env.Status.DeadlineAt}
	disp := e.event(row, tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindDispatch, Status: tracing.MeshRunning,
		Actor: actor, Attempt: n, FirstAttemptAt: first, Reason: carriedReason(row.Reason)})
	disp.Transport = transport
	disp.Details.TimeoutMs = e.hopTimeout(row, now).Milliseconds()
	if remote {
		// The hop is an intent of its own nonce across federation; its
		// trace here and at the peer is linked from this event.
		disp.Details.Extra = map[string]any{"peer": peer, "peerNonce": peerNonce}
	}
	if err := e.append(ctx, []string{id}, disp); err != nil {
		unlock()
		return err
	}
	unlock()
	target := hopTarget{actor: actor, endpoint: agent.HTTPEndpoint, senderKey: creator.PublicKeyB64, transport: transport,
		peerNonce: peerNonce, peerFrame: peerFrame, deadline: row.DeadlineAt}
	e.deliver(id, n, env, target, now)
	return nil
}

// online reports whether actor has a session, and whether the envelope
// was waiting for it already (its wait is recorded). The envelope is
// marked as waiting before the look, so that an actor connecting after it
// wakes the envelope (actorConnected); the mark is dropped when the actor
// is online.
func (e *Engine) online(id, actor string) (online, waiting bool) {
	waiting = e.waitOffline(id, actor)
	if e.dir.Online(actor) {
		e.stopWaiting(id, actor)
		return true, waiting
	}
	return false, waiting
}

// waitForActor parks the hop of row until actor connects, without
// counting an attempt: one wait step, due only at the envelope's deadline,
// and no further log write while it waits (actorConnected wakes it).
// waiting says the step is recorded already.
func (e *Engine) waitForActor(ctx context.Context, row tracing.MeshRow, actor string, waiting bool, now time.Time) error {
	if waiting {
		return nil
	}
	next := row.DeadlineAt
	if next <= 0 {
		next = now.Add(e.cfg.MaxTimeout).UnixMilli()
	}
	ev := e.event(row, tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait, Attempt: row.Attempt,
		FirstAttemptAt: row.FirstAttemptAt, NextAt: next, Reason: "actor offline"})
	if err := e.append(ctx, []string{row.ID}, ev); err != nil {
		e.stopWaiting(row.ID, actor)
		return err
	}
	return nil
}

// hopTimeout is the effective timeout of one attempt: HopTimeout, or less
// when the envelope's deadline is nearer.
func (e *Engine) hopTimeout(row tracing.MeshRow, now time.Time) time.Duration {
	t := e.cfg.HopTimeout
	if row.DeadlineAt > 0 {
		left := time.UnixMilli(row.DeadlineAt).Sub(now)
		t = min(t, max(left, time.Millisecond))
	}
	return t
}

// admit applies actor's policy to the hop of env about to be dispatched
// to it, with the agent that chose the hop (the route's author) as the
// sender (directory.CheckPipelineHop, the relay's own check). A peer
// directory's actor is admitted by its directory, which gets the hop from
// the author of its content; that author must then be an agent of this
// directory, since federation does not forward through intermediate
// directories. It returns "" or FORBIDDEN and the reason.
func (e *Engine) admit(env envelope, actor string, remote bool) (code, msg string) {
	if remote {
		from := contentAuthor(env)
		if _, ok := e.reg.Get(from); ok && e.reg.Serves(from) {
			return "", ""
		}
		return codeForbidden, fmt.Sprintf("the hop to %s carries the output of %s, an agent of another directory: "+
			"federation does not forward through intermediate directories", actor, from)
	}
	if code, msg := e.dir.CheckPipelineHop(routeAuthor(env), actor, intentEnvelope); code != "" {
		return codeForbidden, msg
	}
	return "", ""
}

// hopFrame is the frame that carries a hop to its actor, and how its
// sender was authenticated. The frame is from the author of the hop's
// content: the previous actor, or the creator for the first hop; the
// envelope it carries names the creator and the previous actor
// (prev_actor) apart. No agent signed it, so the directory's delivery
// (directory.Deliver) attests it with auth "api_key", as it does
// for the bus's API-key sends (docs/SECURITY.md, "Attestation").
func hopFrame(env envelope, actor, nonce string, now time.Time) (*wire.IntentFrame, string) {
	from := contentAuthor(env)
	env.PrevActor = ""
	if len(env.Route.Prev) > 0 || from != env.Creator {
		env.PrevActor = from
	}
	f := wire.NewIntentFrame(from, actor, intentEnvelope, encodeEnvelope(env), now)
	f.Nonce = nonce
	return f, directory.BusAuthAPIKey
}

// hopTarget is where one hop attempt goes.
type hopTarget struct {
	actor     string
	endpoint  string // the actor's HTTP endpoint (direct HTTP)
	senderKey string // the creator's public key (WebSocket)
	transport string // ws, direct_http or federation
	peerNonce string // the nonce of the intent that carries the hop to a peer directory
	// peerFrame, when set, is the frame an earlier dispatch of the same
	// attempt recorded under peerNonce; it is relayed again unchanged.
	peerFrame *wire.IntentFrame
	// deadline is the envelope's hard deadline (unix ms, 0 none), which
	// bounds the attempt's timeout.
	deadline int64
}

// deliver hands attempt n of the hop to the actor through the directory's
// one door (directory.Deliver) and arranges for its outcome.
func (e *Engine) deliver(id string, n int, env envelope, to hopTarget, now time.Time) {
	frame, auth := hopFrame(env, to.actor, nonceOf(id), now)
	timeout := e.hopTimeout(tracing.MeshRow{DeadlineAt: to.deadline}, now)
	e.m.hops.Inc()
	del := directory.Delivery{Frame: frame, Auth: auth, Author: routeAuthor(env), Timeout: timeout}
	switch to.transport {
	case directory.TransportDirectHTTP:
		del.Path, del.Endpoint = directory.PathDirectHTTP, to.endpoint
		e.wg.Add(1)
		del.Done = func(o directory.Outcome) {
			defer e.wg.Done()
			e.outcome(id, n, to.transport, o.Result, o.ErrorCode, o.Error)
		}
		e.dir.Deliver(context.Background(), del)
		return
	case directory.TransportFederation:
		frame.Nonce = to.peerNonce
		if to.peerFrame != nil {
			frame = to.peerFrame
		}
		// The peer's directory applies the actor's policy to the hop's
		// author (its route author travels in the envelope).
		del.Frame, del.Path, del.Author = frame, directory.PathPeer, ""
		ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
		go func() {
			select {
			case <-e.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		e.wg.Add(1)
		del.Done = func(o directory.Outcome) {
			defer e.wg.Done()
			defer cancel()
			if e.isClosed() {
				return // Recover queues the hop again after a restart.
			}
			e.outcome(id, n, to.transport, o.Result, o.ErrorCode, o.Error)
		}
		e.dir.Deliver(ctx, del)
		return
	}
	del.SenderKey, del.MessageID, del.Attempt, del.Owner = to.senderKey, env.ID, n, (*meshOwner)(e)
	del.Done = func(o directory.Outcome) {
		if o.Err != nil {
			e.interrupted(id, n, o.Err)
			return
		}
		e.goWarm(func() { e.outcome(id, n, to.transport, o.Result, o.ErrorCode, o.Error) })
	}
	e.dir.Deliver(context.Background(), del)
}

// meshOwner is the gateway as the owner of its hops' nonces: the directory
// hands it the hops whose frames were written to their actors' sessions,
// and it appends their delivered events (directory.Owner).
type meshOwner Engine

// Delivered appends delivered for written hops in one append; their
// subscribers see the received progress the delivered event folds in.
func (o *meshOwner) Delivered(ws []directory.Written) error {
	e := (*Engine)(o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.log.Append(ctx, directory.DeliveredEvents(ws)...); err != nil {
		return fmt.Errorf("record delivered of %s: %w", ws[0].Nonce, err)
	}
	for _, w := range ws {
		if id := w.MessageID; e.hub.has(id) {
			e.goWarm(func() { e.notify(id) })
		}
	}
	return nil
}

// interrupted puts back an attempt the directory could not start (the
// actor left between the check and the hand-off): no attempt is counted.
func (e *Engine) interrupted(id string, n int, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock := e.lock(id)
	defer unlock()
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil || !ok || row.State != tracing.Dispatched || row.Attempt != n {
		return
	}
	ev := e.event(row, tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindWait, Attempt: n - 1,
		FirstAttemptAt: row.FirstAttemptAt, NextAt: e.cfg.Clock().Add(offlineWait / 4).UnixMilli(), Reason: cause.Error()})
	if err := e.append(ctx, []string{id}, ev); err != nil {
		e.lg.Warn("mesh requeue after hand-off failure", "id", id, "err", err)
	}
}

// reply is what an actor answers a hop with, in the result payload's
// "mesh" member. A result payload without it is one output: the payload
// itself. No payload at all, or no outputs, ends the route (x-sink).
type reply struct {
	// Outputs are the payloads to route on: index 0 keeps the envelope's
	// id, the others become fan-out children.
	Outputs []json.RawMessage `json:"outputs"`
	// Next, when present, replaces route.next (the current actor's right).
	Next *[]string `json:"next,omitempty"`
	// Headers are header changes ("" deletes); gateway-managed headers are
	// kept.
	Headers map[string]string `json:"headers,omitempty"`
}

// maxOutputs bounds a fan-out.
const maxOutputs = 256

// decodeReply reads a result payload as a Reply.
func decodeReply(payload json.RawMessage, maxPayload int) (reply, error) {
	p := bytes.TrimSpace(payload)
	if len(p) == 0 || string(p) == "null" {
		return reply{}, nil
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(p, &probe); err != nil || probe == nil {
		if !json.Valid(p) {
			return reply{}, errors.New("reply payload is not JSON")
		}
		return reply{Outputs: []json.RawMessage{p}}, checkOutputs([]json.RawMessage{p}, maxPayload)
	}
	inner, ok := probe["mesh"]
	if !ok {
		return reply{Outputs: []json.RawMessage{p}}, checkOutputs([]json.RawMessage{p}, maxPayload)
	}
	var r reply
	if err := json.Unmarshal(inner, &r); err != nil {
		return reply{}, fmt.Errorf("reply mesh member: %w", err)
	}
	if len(r.Outputs) > maxOutputs {
		return reply{}, fmt.Errorf("reply has %d outputs, at most %d", len(r.Outputs), maxOutputs)
	}
	return r, checkOutputs(r.Outputs, maxPayload)
}

func checkOutputs(outs []json.RawMessage, maxPayload int) error {
	for i, o := range outs {
		if len(o) == 0 || !json.Valid(o) {
			return fmt.Errorf("output %d is not JSON", i)
		}
		if len(o) > maxPayload {
			return fmt.Errorf("output %d is %d bytes, at most %d", i, len(o), maxPayload)
		}
	}
	return nil
}

// outcome records how attempt n of envelope id ended: rf is the actor's
// result, or nil with code and msg saying why there is none.
func (e *Engine) outcome(id string, n int, transport string, rf *wire.ResultFrame, code, msg string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock := e.lock(id)
	defer unlock()
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil || !ok {
		return
	}
	if row.Status.Terminal() || (row.State != tracing.Dispatched && row.State != tracing.Delivered) || row.Attempt != n {
		e.m.stale.Inc()
		e.lg.Info("mesh outcome for a settled attempt dropped", "id", id, "attempt", n, "status", row.Status)
		return
	}
	env, err := envelopeOf(row)
	if err != nil {
		e.record(e.fail(ctx, row, envelope{ID: id, Payload: json.RawMessage("{}")}, nil, reasonBadReply, err.Error(), codePermanent), id)
		return
	}
	if row.FirstAttemptAt > 0 {
		env.Headers[headerFirstAttempt] = rfc3339(time.UnixMilli(row.FirstAttemptAt))
	}
	var pre []tracing.Event
	if row.State == tracing.Dispatched {
		pre = append(pre, tracing.Event{Nonce: row.Nonce, State: tracing.Delivered, Transport: transport, Attempt: n})
	}
	switch {
	case rf == nil:
		e.record(e.failedAttempt(ctx, row, env, n, pre, code, msg, true), id)
	case !rf.Success:
		c := rf.ErrorCode
		if c == "" {
			c = directory.CodeResultError
		}
		m := rf.Error
		if m == "" {
			m = "the actor answered with a failure"
		}
		e.record(e.failedAttempt(ctx, row, env, n, pre, c, m, !nonRetryable[c]), id)
	default:
		reply, err := decodeReply(rf.Payload, e.cfg.MaxPayloadBytes)
		if err != nil {
			e.record(e.fail(ctx, row, env, pre, reasonBadReply, err.Error(), codePermanent), id)
			return
		}
		e.record(e.advance(ctx, row, env, reply, pre, ""), id)
	}
}

func (e *Engine) record(err error, id string) {
	if err != nil {
		e.lg.Warn("mesh record", "id", id, "err", err)
	}
}

// failedAttempt applies the actor's policy to failed attempt n: retry
// later, reroute to onExhausted, or fail the envelope.
func (e *Engine) failedAttempt(ctx context.Context, row tracing.MeshRow, env envelope, n int, pre []tracing.Event, code, msg string, retryable bool) error {
	now := e.cfg.Clock()
	actor := env.Route.Curr
	pol := e.policy(actor)
	first := time.UnixMilli(row.FirstAttemptAt)
	if row.FirstAttemptAt == 0 {
		first = now
	}
	msg = code + ": " + msg
	if row.DeadlineAt > 0 && now.UnixMilli() >= row.DeadlineAt {
		return e.fail(ctx, row, env, pre, reasonTimeout, "the envelope's deadline passed: "+msg, codeTimeout)
	}
	delay, reason := pol.Retry(n, retryable, first, now, e.draw(row.ID, n))
	if reason == "" {
		ev := e.event(row, tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindRetry, Status: tracing.MeshRetrying,
			Actor: actor, Attempt: n, FirstAttemptAt: row.FirstAttemptAt, NextAt: now.Add(delay).UnixMilli(), Error: msg, Reason: code})
		ev.Details.ErrorCode, ev.Details.Error, ev.Details.Retryable = code, msg, true
		e.m.retries.Inc()
		return e.append(ctx, []string{row.ID}, append(pre, ev)...)
	}
	if len(pol.OnExhausted) > 0 {
		env.Route = meshRoute{Prev: env.Route.Prev, Curr: env.Route.Curr, Next: append([]string{}, pol.OnExhausted...)}
		env.Status.Reason = reasonPolicyRouted
		return e.advance(ctx, row, env, reply{Outputs: []json.RawMessage{env.Payload}}, pre, reasonPolicyRouted)
	}
	return e.fail(ctx, row, env, pre, reason, msg, code)
}

// fail ends the envelope as failed: recorded in x-sink and x-sump.
func (e *Engine) fail(ctx context.Context, row tracing.MeshRow, env envelope, pre []tracing.Event, reason, msg, code string) error {
	env.Status.Phase = string(tracing.MeshFailed)
	env.Status.Reason = reason
	ev := e.event(row, tracing.DeadLetter, tracing.MeshStep{Kind: tracing.MeshKindFailed, Status: tracing.MeshFailed,
		Reason: reason, Error: msg, Sink: true, Sump: true, Envelope: encodeStored(env), Attempt: row.Attempt})
	ev.Details.ErrorCode, ev.Details.Error = code, msg
	if err := e.append(ctx, []string{row.ID}, append(pre, ev)...); err != nil {
		return err
	}
	e.stopWaiting(row.ID, row.Actor)
	e.m.finished.WithLabelValues(string(tracing.MeshFailed)).Inc()
	return nil
}

// advance routes the outputs of a successful hop on: index 0 keeps the
// envelope, the others become children; an exhausted route or no outputs
// ends in x-sink.
func (e *Engine) advance(ctx context.Context, row tracing.MeshRow, env envelope, reply reply, pre []tracing.Event, reason string) error {
	actor := env.Route.Curr
	route := env.Route
	author := env.Author
	// The outputs are the actor's, except in an onExhausted reroute, which
	// carries on what the failed actor was given.
	content := actor
	if reason == reasonPolicyRouted {
		content = contentAuthor(env)
	}
	if reply.Next != nil {
		// The hops this actor names are its own: their actors' policies
		// admit them with it as the sender.
		author = actor
		r, err := route.RewriteNext(actor, *reply.Next, env.Hop, e.cfg.MaxHops)
		if err != nil {
			return e.fail(ctx, row, env, pre, reasonBadReply, err.Error(), codePermanent)
		}
		for _, a := range r.Next {
			if !e.known(a) {
				return e.fail(ctx, row, env, pre, reasonBadReply, fmt.Sprintf("rewritten next names unknown actor %q", a), codeUnknownActor)
			}
		}
		route = r
	}
	release, code, msg, err := e.checkFanout(ctx, env.Creator, len(reply.Outputs)-1)
	defer release()
	if err != nil {
		return err
	}
	if code != "" {
		return e.fail(ctx, row, env, pre, reasonNonRetryable, msg, code)
	}
	headers := mergeHeaders(env.Headers, reply.Headers)
	progress := progress(row.Progress, route)
	shifted := route.Shift()
	hop := env.Hop + 1
	events := pre
	ids := []string{row.ID}
	var starts []string
	var eager *pendingHop
	if len(reply.Outputs) == 0 {
		final := cloneEnvelope(env)
		final.Route = shifted
		final.Headers = headers
		final.Hop = hop
		final.Author = author
		final.PrevActor = content
		final.Status.Phase = string(tracing.MeshSucceeded)
		events = append(events, e.sinkEvent(row, final, reason))
	}
	for i, out := range reply.Outputs {
		ce := cloneEnvelope(env)
		ce.Route = meshRoute{Prev: append([]string{}, shifted.Prev...), Curr: shifted.Curr, Next: append([]string{}, shifted.Next...)}
		ce.Headers = mergeHeaders(headers, nil)
		ce.Payload = out
		ce.Hop = hop
		ce.Author = author
		ce.PrevActor = content
		if i == 0 {
			events = append(events, e.nextEvents(row, ce, progress, reason)...)
			if !ce.Route.Done() && hop < e.cfg.MaxHops {
				if p, ok := e.eagerDispatch(row, ce, reason); ok {
					events = append(events, p.ev)
					eager = &p
				} else {
					starts = append(starts, ce.ID)
				}
			}
			continue
		}
		ce.ID = uuid.NewString()
		ce.ParentID = env.ID
		ce.FanoutIndex = i
		ce.Status.CreatedAt = rfc3339(e.cfg.Clock())
		child := tracing.MeshRow{ID: ce.ID, Nonce: nonceOf(ce.ID), DeadlineAt: row.DeadlineAt, Creator: row.Creator}
		to := ce.Route.Curr
		if to == "" {
			to = sink
		}
		created := tracing.Event{Nonce: child.Nonce, State: tracing.Received, From: env.Creator, To: to, IntentType: intentEnvelope,
			Transport: "mesh", Details: tracing.Details{Owner: tracing.OwnerMesh, Mesh: tracing.MeshStep{Kind: tracing.MeshKindCreated,
				ID: ce.ID, ParentID: env.ID, Creator: env.Creator, DeadlineAt: row.DeadlineAt, Status: tracing.MeshPending,
				Envelope: encodeStored(ce), Hop: hop, Actor: ce.Route.Curr, Progress: progress}.Encode()}}
		events = append(events, created)
		if ce.Route.Done() {
			// Straight to x-sink: a delivery to the system actor.
			events = append(events,
				e.event(child, tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindDispatch, Status: tracing.MeshRunning, Actor: sink}),
				tracing.Event{Nonce: child.Nonce, State: tracing.Delivered, Transport: "mesh"})
		}
		events = append(events, e.nextEvents(child, ce, progress, reason)...)
		ids = append(ids, ce.ID)
		if !ce.Route.Done() && hop < e.cfg.MaxHops {
			starts = append(starts, ce.ID)
		}
	}
	if err := e.append(ctx, ids, events...); err != nil {
		return err
	}
	if eager != nil {
		// Outside the envelope's lock, which the caller holds.
		id, env, now := row.ID, eager.env, eager.now
		to := hopTarget{actor: eager.actor, senderKey: eager.key, transport: directory.TransportWS, deadline: row.DeadlineAt}
		e.goWarm(func() { e.deliver(id, 1, env, to, now) })
	}
	for _, id := range starts {
		e.startAttempt(id)
	}
	return nil
}

// checkFanout applies the creator's cap of open envelopes to the children
// a hop's fan-out would open: they are the creator's envelopes too, and an
// actor may neither multiply one creation past the cap nor fill the
// creator's cap with its outputs. It returns "" when the children fit, else
// TOO_MANY_OPEN_ENVELOPES and the reason the envelope fails with. The
// creator's creations wait until release (after the children are
// recorded), so that racing hops and creations cannot pass the cap
// together.
func (e *Engine) checkFanout(ctx context.Context, creator string, children int) (release func(), code, msg string, err error) {
	limit := e.cfg.MaxOpenPerCreator
	if children <= 0 || limit <= 0 {
		return func() {}, "", "", nil
	}
	unlock := e.creates.Lock(creator)
	open, err := e.log.MeshOpenCount(ctx, creator, limit)
	if err != nil {
		return unlock, "", "", err
	}
	if open+children > limit {
		return unlock, codeTooManyOpen, fmt.Sprintf("the fan-out of %d children would take %s past %d open envelopes, "+
			"the most one creator may have (it has %d)", children, creator, limit, open), nil
	}
	return unlock, "", "", nil
}

// known reports whether actor is an agent of this directory or of a
// pinned peer directory.
func (e *Engine) known(actor string) bool {
	if _, ok := e.reg.Get(actor); ok {
		return true
	}
	_, ok := e.dir.PeerFor(actor)
	return ok
}

// pendingHop is a next hop dispatched in the same append as the previous
// hop's outcome, delivered once that append is committed.
type pendingHop struct {
	ev         tracing.Event
	env        envelope
	actor, key string
	now        time.Time
}

// carriedReason is the reason a dispatch keeps of the envelope's reason
// (tracing folds a dispatch's reason in, "" included): a wait's or a
// retry's ends with it, a reroute says how the envelope got here.
func carriedReason(reason string) string {
	if reason == reasonPolicyRouted {
		return reason
	}
	return ""
}

// eagerDispatch prepares the dispatch of env's next hop when it can start
// at once (not paused, before the deadline, actor online), saving the
// scheduler's separate append; otherwise the scheduler starts it. reason
// is the hop's (nextEvents').
func (e *Engine) eagerDispatch(row tracing.MeshRow, env envelope, reason string) (pendingHop, bool) {
	now := e.cfg.Clock()
	if row.Status != tracing.MeshRunning || (row.DeadlineAt > 0 && now.UnixMilli() >= row.DeadlineAt) {
		return pendingHop{}, false
	}
	actor := env.Route.Curr
	_, okA := e.reg.Get(actor)
	creator, okC := e.reg.Get(env.Creator)
	if !okA || !okC || !e.dir.Online(actor) {
		return pendingHop{}, false
	}
	if _, remote := e.dir.PeerFor(actor); remote {
		// A stale local registration in a pinned peer's domain: the hop is
		// the peer's agent's, and the scheduler relays it there.
		return pendingHop{}, false
	}
	if code, _ := e.admit(env, actor, false); code != "" {
		// The scheduler's attempt records the refusal.
		return pendingHop{}, false
	}
	first := now.UnixMilli()
	env = cloneEnvelope(env)
	env.Headers[headerFirstAttempt] = rfc3339(time.UnixMilli(first))
	env.Status = status{Phase: "processing", Actor: actor, Attempt: 1, MaxAttempts: e.policy(actor).MaxAttempts,
		CreatedAt: rfc3339(time.UnixMicro(row.CreatedAt)), UpdatedAt: rfc3339(now), DeadlineAt: env.Status.DeadlineAt}
	ev := e.event(row, tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindDispatch, Status: tracing.MeshRunning,
		Actor: actor, Attempt: 1, FirstAttemptAt: first, Reason: carriedReason(reason)})
	ev.Transport = directory.TransportWS
	ev.Details.TimeoutMs = e.hopTimeout(row, now).Milliseconds()
	return pendingHop{ev: ev, env: env, actor: actor, key: creator.PublicKeyB64, now: now}, true
}

// nextEvents are the events that move envelope env (its row is row) after
// a completed hop: x-sink at the end of the route, x-sump past the hop
// limit, otherwise queued for the next actor.
func (e *Engine) nextEvents(row tracing.MeshRow, env envelope, progress float64, reason string) []tracing.Event {
	if env.Route.Done() {
		env.Status.Phase = string(tracing.MeshSucceeded)
		return []tracing.Event{e.sinkEvent(row, env, reason)}
	}
	if env.Hop >= e.cfg.MaxHops {
		env.Status.Phase = string(tracing.MeshFailed)
		env.Status.Reason = reasonHopLimit
		msg := fmt.Sprintf("the envelope made %d hops, the limit", env.Hop)
		ev := e.event(row, tracing.DeadLetter, tracing.MeshStep{Kind: tracing.MeshKindFailed, Status: tracing.MeshFailed,
			Reason: reasonHopLimit, Error: msg, Sink: true, Sump: true, Envelope: encodeStored(env), Hop: env.Hop, Progress: progress})
		ev.Details.ErrorCode, ev.Details.Error = codeHopLimit, msg
		e.m.finished.WithLabelValues(string(tracing.MeshFailed)).Inc()
		return []tracing.Event{ev}
	}
	env.Status.Phase = string(tracing.MeshPending)
	env.Status.Actor = env.Route.Curr
	env.Status.Attempt = 0
	return []tracing.Event{e.event(row, tracing.Queued, tracing.MeshStep{Kind: tracing.MeshKindHop, Status: tracing.MeshRunning,
		Envelope: encodeStored(env), Hop: env.Hop, Actor: env.Route.Curr, Progress: progress, Reason: reason})}
}

// sinkEvent records env in x-sink as succeeded.
func (e *Engine) sinkEvent(row tracing.MeshRow, env envelope, reason string) tracing.Event {
	e.m.finished.WithLabelValues(string(tracing.MeshSucceeded)).Inc()
	return e.event(row, tracing.Acked, tracing.MeshStep{Kind: tracing.MeshKindSink, Status: tracing.MeshSucceeded,
		Envelope: encodeStored(env), Hop: env.Hop, Progress: 100, Sink: true, Reason: reason})
}

// expire fails envelope id whose deadline passed (the server's backstop
// for envelopes that stall).
func (e *Engine) expire(ctx context.Context, id string) error {
	unlock := e.lock(id)
	defer unlock()
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil || !ok || row.Status.Terminal() {
		return err
	}
	if taken, err := e.log.Unadopted(ctx, row.Nonce); err != nil || taken {
		return err // a takeover's: adopted, its first attempt expires it
	}
	env, err := envelopeOf(row)
	if err != nil {
		env = envelope{ID: id, Payload: json.RawMessage("{}")}
	}
	return e.fail(ctx, row, env, nil, reasonTimeout, "the envelope's deadline passed", codeTimeout)
}

// Cancel ends envelope id as canceled (idempotent for a canceled one). A
// hop in flight may still run at its actor; its answer is dropped.
func (e *Engine) Cancel(ctx context.Context, id string) (tracing.MeshRow, error) {
	unlock := e.lock(id)
	defer unlock()
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil {
		return row, err
	}
	if !ok {
		return row, httpjson.Errorf(http.StatusNotFound, codeNotFound, "no envelope %s", id)
	}
	if row.Status == tracing.MeshCanceled {
		return row, nil
	}
	if row.Status.Terminal() {
		return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s already %s", id, row.Status)
	}
	env, err := envelopeOf(row)
	if err != nil {
		env = envelope{ID: id, Payload: json.RawMessage("{}")}
	}
	env.Status.Phase = string(tracing.MeshCanceled)
	ev := e.event(row, tracing.Failed, tracing.MeshStep{Kind: tracing.MeshKindCancel, Status: tracing.MeshCanceled,
		Reason: reasonCanceled, Sink: true, Envelope: encodeStored(env), Attempt: row.Attempt})
	ev.Details.ErrorCode, ev.Details.Error = codeCanceled, "canceled by the client"
	if err := e.append(ctx, []string{id}, ev); err != nil {
		return row, err
	}
	e.stopWaiting(id, row.Actor)
	e.m.finished.WithLabelValues(string(tracing.MeshCanceled)).Inc()
	out, _, err := e.log.MeshEnvelope(ctx, id)
	return out, err
}

// Processing reports that actor, the actor of envelope id's current hop,
// started processing attempt n of it: the hop's processing share of the
// progress (tracing.MeshProcessingShare) goes to the envelope's live
// subscribers (SSE, A2A, MCP), as the sidecar's processing report reaches
// Asya's clients; like that report it changes no state and writes nothing
// to the log (the received point, the delivered event, is in the log). A
// report for another actor or attempt, or a settled one, is a conflict.
func (e *Engine) Processing(ctx context.Context, id, actor string, n int) (tracing.MeshRow, error) {
	unlock := e.lock(id)
	defer unlock()
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil {
		return row, err
	}
	if !ok || (row.Actor != actor && row.Creator != actor) {
		return tracing.MeshRow{}, httpjson.Errorf(http.StatusNotFound, codeNotFound, "no envelope %s", id)
	}
	if row.Actor != actor || row.Status.Terminal() || row.Attempt != n ||
		(row.State != tracing.Dispatched && row.State != tracing.Delivered) {
		return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s has no attempt %d of %s in flight", id, n, actor)
	}
	p := tracing.MeshHopProgress(row.Envelope, tracing.MeshProcessingShare)
	if p <= row.Progress {
		return row, nil
	}
	row.Progress = p
	if !statusOff(row) {
		e.hub.progress(row)
	}
	return row, nil
}

// Pause stops envelope id before its next hop (a hop in flight finishes).
func (e *Engine) Pause(ctx context.Context, id string) (tracing.MeshRow, error) {
	return e.annotate(ctx, id, tracing.MeshKindPause, tracing.MeshPaused)
}

// Resume lets a paused envelope go on.
func (e *Engine) Resume(ctx context.Context, id string) (tracing.MeshRow, error) {
	row, err := e.annotate(ctx, id, tracing.MeshKindResume, tracing.MeshRunning)
	if err == nil {
		e.startAttempt(id)
	}
	return row, err
}

// annotate records a pause or resume on the envelope's current state.
func (e *Engine) annotate(ctx context.Context, id, kind string, to tracing.MeshStatus) (tracing.MeshRow, error) {
	unlock := e.lock(id)
	defer unlock()
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil {
		return row, err
	}
	if !ok {
		return row, httpjson.Errorf(http.StatusNotFound, codeNotFound, "no envelope %s", id)
	}
	if !lifecycle.Allows(string(row.Status), string(to), stepOn(kind)) || row.Status == to {
		return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s is %s", id, row.Status)
	}
	// The relay records delivered for a hop in flight without this lock,
	// so the state read may be one step behind: read again and retry.
	for try := 0; ; try++ {
		ev := e.event(row, row.State, tracing.MeshStep{Kind: kind, Status: to, Attempt: row.Attempt})
		if row.State == tracing.Queued {
			// A queued step resets nextAt; keep the scheduled time.
			st := tracing.MeshStep{Kind: kind, Status: to, Attempt: row.Attempt, NextAt: row.NextAt}
			ev.Details.Mesh = st.Encode()
		}
		err := e.append(ctx, []string{id}, ev)
		if err == nil {
			break
		}
		var te *tracing.TransitionError
		if !errors.As(err, &te) || try >= 4 {
			return row, err
		}
		if row, _, err = e.log.MeshEnvelope(ctx, id); err != nil {
			return row, err
		}
		if !lifecycle.Allows(string(row.Status), string(to), stepOn(kind)) || row.Status == to {
			return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s is %s", id, row.Status)
		}
	}
	out, _, err := e.log.MeshEnvelope(ctx, id)
	return out, err
}

// Requeue sends a dead envelope again: a new envelope (parent_id = the dead
// one) with its last payload and the rest of its route from the actor it
// failed at. The dead envelope stays finished.
func (e *Engine) Requeue(ctx context.Context, id string) (tracing.MeshRow, error) {
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil {
		return row, err
	}
	if !ok {
		return row, httpjson.Errorf(http.StatusNotFound, codeNotFound, "no envelope %s", id)
	}
	if !row.Sump {
		return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s is not a dead letter", id)
	}
	env, err := envelopeOf(row)
	if err != nil {
		return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s cannot be read: %v", id, err)
	}
	var actors []string
	if env.Route.Curr != "" {
		actors = append(actors, env.Route.Curr)
	}
	actors = append(actors, env.Route.Next...)
	if len(actors) == 0 {
		return row, httpjson.Errorf(http.StatusConflict, codeConflict, "envelope %s has no hop left to run", id)
	}
	return e.Create(ctx, CreateRequest{Creator: row.Creator, Route: actors, Payload: env.Payload, Headers: env.Headers, ParentID: id,
		Prev: append([]string{}, env.Route.Prev...), Author: env.Author, ContentAuthor: contentAuthor(env)})
}
