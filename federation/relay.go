package federation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// forwardPayload is what an intent row carries to build its message.
type forwardPayload struct {
	Frame      string `json:"frame"`
	From       string `json:"from"`
	To         string `json:"to"`
	IntentType string `json:"intentType"`
	Attempt    int    `json:"attempt"`
	TimeoutMs  int64  `json:"timeoutMs"`
	// AdmittedMs is when the origin admitted a durable frame (unix ms).
	AdmittedMs int64 `json:"admittedMs,omitempty"`
	// VouchedAuth is how the origin authenticated the sender of an
	// unsigned frame.
	VouchedAuth string `json:"vouchedAuth,omitempty"`
	// JWS is the sender's beam/2 envelope.
	JWS string `json:"jws,omitempty"`
}

// Extra error codes of federation.
const (
	// codeBusy: the target directory has too many requests in flight.
	codeBusy = "BUSY"
	// codeSenderUnresolved: the target directory could not resolve the
	// sender's key from its home directory.
	codeSenderUnresolved = "SENDER_UNRESOLVED"
	// codeHopLimit: the intent crossed too many directories.
	codeHopLimit = "HOP_LIMIT"
	// codeLoop: the intent came back to a directory it crossed.
	codeLoop = "LOOP_DETECTED"
	// codeUnknownAgent: a resolve request named no agent of the directory.
	codeUnknownAgent = "UNKNOWN_AGENT"
	// codeUndeliverable: a durable row was terminated (DEAD).
	codeUndeliverable = "FEDERATION_UNDELIVERABLE"
)

// PeerFor implements directory.Remote: the pinned peer whose domain is
// to's domain.
func (n *Node) PeerFor(to string) (string, bool) {
	d, err := domainOf(to)
	if err != nil || d == n.cfg.Domain {
		return "", false
	}
	n.mu.Lock()
	_, ok := n.peers[d]
	n.mu.Unlock()
	return d, ok
}

// Forward implements directory.Remote: it records events and the outbox
// row of the intent in one transaction, then wakes the relay. The bus uses
// it for durable sends to remote agents (Owner bus, no Deadline): the row
// is retried while the peer is down and the outcome is recorded on the
// nonce when the peer answers.
func (n *Node) Forward(ctx context.Context, req directory.ForwardRequest, events ...tracing.Event) error {
	if req.Peer == "" {
		p, ok := n.PeerFor(req.To)
		if !ok {
			return fmt.Errorf("forward %s: no pinned peer serves %s", req.Nonce, req.To)
		}
		req.Peer = p
	}
	if len(req.Frame) == 0 || req.Nonce == "" {
		return fmt.Errorf("forward %s: frame and nonce are required", req.Nonce)
	}
	if req.Owner == "" {
		req.Owner = tracing.OwnerDirectory
	}
	if req.Attempt <= 0 {
		req.Attempt = 1
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = n.cfg.DurableTimeout
	}
	timeout = min(timeout, maxIntentTimeout)
	fp := forwardPayload{Frame: string(req.Frame), From: req.From, To: req.To,
		IntentType: req.IntentType, Attempt: req.Attempt, TimeoutMs: timeout.Milliseconds(), VouchedAuth: req.VouchedAuth, JWS: req.JWS}
	if !req.Admitted.IsZero() {
		fp.AdmittedMs = req.Admitted.UnixMilli()
	}
	payload, err := json.Marshal(fp)
	if err != nil {
		return fmt.Errorf("forward %s: %w", req.Nonce, err)
	}
	row := newRow{
		EventID:     req.Nonce + "/" + strconv.Itoa(req.Attempt) + "/" + newID()[:8],
		Kind:        kindIntent,
		Peer:        req.Peer,
		Nonce:       req.Nonce,
		Owner:       req.Owner,
		Payload:     payload,
		MaxAttempts: n.cfg.MaxAttempts,
		Deadline:    req.Deadline,
	}
	if row.Deadline.IsZero() {
		row.Deadline = n.clock().Add(n.cfg.DurableMaxAge)
	}
	if err := n.outbox.Enqueue(ctx, row, events...); err != nil {
		return err
	}
	n.m.enqueued.WithLabelValues(req.Peer).Inc()
	n.Kick()
	return nil
}

// relayTick claims due rows and publishes them, at most MaxInFlight at a
// time: it claims while slots are free and rows are due.
func (n *Node) relayTick(context.Context) error {
	for {
		free := cap(n.slots) - len(n.slots)
		if free == 0 {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		claims, err := n.outbox.Claim(ctx, n.cfg.RelayID, free)
		cancel()
		if err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		for _, c := range claims {
			n.slots <- struct{}{}
			go func() {
				defer func() { <-n.slots }()
				n.process(c)
			}()
		}
		if len(claims) < free {
			return nil
		}
	}
}

// process publishes one claimed row and finalizes it.
func (n *Node) process(c claim) {
	ctx, cancel := context.WithTimeout(context.Background(), maxIntentTimeout+time.Minute)
	defer cancel()
	var fp forwardPayload
	if err := json.Unmarshal(c.Payload, &fp); err != nil || c.Kind != kindIntent {
		n.kill(ctx, c, fmt.Sprintf("unreadable row (kind %q): %v", c.Kind, err))
		return
	}
	now := n.clock()
	if !c.Deadline.IsZero() && !now.Before(c.Deadline) {
		n.kill(ctx, c, "deadline passed before the peer confirmed")
		return
	}
	if c.MaxAttempts > 0 && c.Attempts >= c.MaxAttempts {
		n.kill(ctx, c, fmt.Sprintf("%d attempts failed; last error: %s", c.Attempts, c.LastError))
		return
	}
	row, ok, err := n.cfg.Log.Intent(ctx, c.Nonce)
	if err != nil {
		n.retry(ctx, c, fmt.Sprintf("look up intent: %v", err))
		return
	}
	if !ok {
		n.kill(ctx, c, "intent is not in the log")
		return
	}
	if c.Owner == string(tracing.OwnerDirectory) && row.Status != tracing.Dispatched && row.Status != tracing.Delivered {
		n.kill(ctx, c, fmt.Sprintf("intent is already %s at the origin", row.Status))
		return
	}
	conn, ok := n.connFor(c.Peer)
	if !ok {
		if _, pinned := n.pinnedKey(c.Peer); !pinned {
			n.kill(ctx, c, "peer "+c.Peer+" is not pinned")
			return
		}
		n.retry(ctx, c, "no connection to "+c.Peer)
		return
	}
	timeout := time.Duration(fp.TimeoutMs) * time.Millisecond
	wait := timeout + 5*time.Second
	if !c.Deadline.IsZero() {
		wait = min(wait, c.Deadline.Sub(now)+time.Second)
	}
	msg := &Message{
		Kind: kindIntent, ID: newID(), From: n.cfg.Domain, To: c.Peer,
		IssuedAt: now.UnixMilli(), Expires: now.Add(min(wait+time.Minute, maxMessageTTL)).UnixMilli(),
		EventID: c.EventID, Nonce: c.Nonce, Frame: fp.Frame, Hop: 1, Path: []string{n.cfg.Domain},
		TimeoutMs: fp.TimeoutMs, Owner: c.Owner, Admitted: fp.AdmittedMs, VouchedAuth: fp.VouchedAuth, JWS: fp.JWS,
	}
	tok, err := seal(msg, n.cfg.Key)
	if err != nil {
		n.kill(ctx, c, err.Error())
		return
	}
	t0 := time.Now()
	reply, err := conn.Request(Subject(c.Peer, n.cfg.Domain, kindIntent), tok, wait)
	n.m.publishSeconds.Observe(time.Since(t0).Seconds())
	if err != nil {
		n.m.publishFailures.WithLabelValues(c.Peer, "transport").Inc()
		n.retry(ctx, c, fmt.Sprintf("request to %s: %v", c.Peer, err))
		return
	}
	res, err := open(reply.Data, n.cfg.Domain, c.Peer, kindResult, n.pinnedKey, n.clock())
	if err == nil && res.Re != msg.ID {
		err = rejectf(rejectMisaddressed, "reply answers %q, not %q", truncate(res.Re), msg.ID)
	}
	if err != nil {
		n.rejected(err, c.Peer)
		n.m.publishFailures.WithLabelValues(c.Peer, "reply").Inc()
		n.retry(ctx, c, fmt.Sprintf("reply from %s: %v", c.Peer, err))
		return
	}
	n.contact(c.Peer)
	durable := c.Owner != string(tracing.OwnerDirectory)
	if res.Status == statusError {
		switch {
		case res.ErrorCode == directory.CodeInProgress || res.ErrorCode == codeBusy ||
			res.ErrorCode == codeSenderUnresolved || res.ErrorCode == directory.CodeRelayError:
			n.m.publishFailures.WithLabelValues(c.Peer, "remote_busy").Inc()
			n.retry(ctx, c, fmt.Sprintf("%s answered %s: %s", c.Peer, res.ErrorCode, res.Error))
			return
		case durable && directory.RetryableCode(res.ErrorCode):
			n.m.publishFailures.WithLabelValues(c.Peer, "remote_retryable").Inc()
			n.retry(ctx, c, fmt.Sprintf("%s answered %s: %s", c.Peer, res.ErrorCode, res.Error))
			return
		}
	}
	n.finalize(ctx, c, res, row)
}

// finalize records the peer's outcome on the nonce and marks the row
// PUBLISHED in one transaction, then answers a sender of this process
// that waits for it.
func (n *Node) finalize(ctx context.Context, c claim, res *Message, row tracing.IntentRow) {
	finish, _ := n.cfg.Directory.SettleRemote(c.Nonce)
	var rf *wire.ResultFrame
	if res.Status == statusResult {
		var err error
		if rf, err = wire.DecodeResultFrame([]byte(res.Result)); err != nil || rf.Nonce != c.Nonce {
			n.lg.Warn("peer sent an unusable result frame", "peer", c.Peer, "nonce", c.Nonce, "err", err)
			res = &Message{Status: statusError, ErrorCode: directory.CodeDeliveryFailed,
				Error: "peer " + c.Peer + " returned an unusable result frame", Delivered: res.Delivered}
			rf = nil
		}
	}
	events := n.outcomeEvents(c, res, rf, row)
	err := n.outbox.Publish(ctx, c, events...)
	var te *tracing.TransitionError
	if errors.As(err, &te) {
		// The nonce moved meanwhile (a timeout): record as an annotation.
		if fresh, ok, e := n.cfg.Log.Intent(ctx, c.Nonce); e == nil && ok {
			events = n.outcomeEvents(c, res, rf, fresh)
			err = n.outbox.Publish(ctx, c, events...)
		}
	}
	if errors.Is(err, errUnrecordable) {
		// The intent is already acked (its outcome came through another
		// claim): nothing to record, the row is finished as it stands.
		n.lg.Info("outbox row of an acked intent left as it is", "row", c.ID, "nonce", c.Nonce)
		err = nil
	}
	if errors.Is(err, errClaimLost) {
		n.lg.Warn("claim lost before PUBLISHED; recording the outcome only", "row", c.ID, "nonce", c.Nonce)
		if len(events) > 0 {
			if _, e := n.cfg.Log.Append(ctx, events...); e != nil {
				n.lg.Info("outcome already recorded", "nonce", c.Nonce, "err", e)
			}
		}
		err = nil
	}
	if err != nil {
		n.lg.Error("finalize outbox row", "row", c.ID, "nonce", c.Nonce, "err", err)
		finish(nil, &directory.RelayError{Code: directory.CodeRelayError, Message: "outcome could not be recorded: " + err.Error(), Nonce: c.Nonce})
		return
	}
	n.m.published.WithLabelValues(c.Peer, c.Kind).Inc()
	if len(events) > 0 {
		n.busOutcome(c)
	}
	switch {
	case rf != nil:
		n.cfg.Directory.NoteRemoteResultJWS(c.Nonce, res.ResultJWS)
		finish(rf.Raw, nil)
	default:
		result := []byte(res.Result)
		if len(result) == 0 {
			result = wire.FailureResult(c.Nonce, res.ErrorCode, res.Error, n.clock(), nil)
		}
		finish(nil, &directory.RelayError{Code: res.ErrorCode, Message: res.Error, Nonce: c.Nonce, Result: result})
	}
}

// outcomeEvents are the origin's events for the peer's outcome, given the
// nonce's current row.
func (n *Node) outcomeEvents(c claim, res *Message, rf *wire.ResultFrame, row tracing.IntentRow) []tracing.Event {
	ev := func(s tracing.State) tracing.Event {
		return tracing.Event{Nonce: c.Nonce, State: s, Transport: directory.TransportFederation, Attempt: row.Attempt}
	}
	peerExtra := func(kv ...any) map[string]any {
		m := map[string]any{"peer": c.Peer, "outboxId": c.ID}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	now := n.clock()
	var lat *int64
	if row.RequestedAt > 0 {
		ms := max(now.Sub(row.RequestedTime()).Milliseconds(), 0)
		lat = &ms
	}
	var final tracing.Event
	switch {
	case rf != nil && wire.IsAsyncAcceptance(rf):
		final = ev(tracing.Delivered)
		final.Details = tracing.Details{LatencyMs: lat, Result: rf.Raw, Extra: peerExtra("asyncAccepted", true)}
	case rf != nil && rf.Success:
		final = ev(tracing.Acked)
		final.Details = tracing.Details{LatencyMs: lat, Result: rf.Raw, Extra: peerExtra()}
		if res.ResultJWS != "" {
			final.Details.Extra["resultJWS"], final.Details.Extra["resultProtocol"] = res.ResultJWS, directory.ProtocolBeam2
		}
	case rf != nil:
		code := rf.ErrorCode
		if code == "" {
			code = directory.CodeResultError
		}
		final = ev(tracing.Failed)
		final.Details = tracing.Details{ErrorCode: code, Error: rf.Error, Retryable: directory.RetryableCode(code),
			LatencyMs: lat, Result: rf.Raw, Extra: peerExtra("recipientResult", true)}
	default:
		result := []byte(res.Result)
		if len(result) == 0 {
			result = wire.FailureResult(c.Nonce, res.ErrorCode, res.Error, now, lat)
		}
		final = ev(tracing.Failed)
		final.Details = tracing.Details{ErrorCode: res.ErrorCode, Error: res.Error, Retryable: directory.RetryableCode(res.ErrorCode),
			LatencyMs: lat, Result: result, Extra: peerExtra("remoteError", true)}
	}
	switch row.Status {
	case tracing.Dispatched:
		var out []tracing.Event
		if rf != nil || res.Delivered {
			d := ev(tracing.Delivered)
			d.Details.Extra = peerExtra()
			out = append(out, d)
		}
		if final.State == tracing.Delivered && len(out) > 0 {
			out[0] = final
			return out
		}
		return append(out, final)
	case tracing.Delivered:
		return []tracing.Event{final}
	case tracing.Failed, tracing.DeadLetter:
		late := ev(row.Status)
		late.Details.Extra = peerExtra("lateResult", true)
		if rf != nil {
			late.Details.Extra["lateResultFrame"] = json.RawMessage(rf.Raw)
			late.Details.Extra["lateSuccess"] = rf.Success
		} else {
			late.Details.Extra["lateErrorCode"] = res.ErrorCode
		}
		return []tracing.Event{late}
	default:
		return nil
	}
}

// retryPolicy is c's retry policy: RetryBase doubling up to SyncRetryMax
// for rows whose sender waits, DurableRetryMax for durable sends, and
// c.MaxAttempts attempts (0: no limit).
func (n *Node) retryPolicy(c claim) attempt.Policy {
	limit := n.cfg.DurableRetryMax
	if c.Owner == string(tracing.OwnerDirectory) {
		limit = n.cfg.SyncRetryMax
	}
	return attempt.Policy{
		Backoff:     attempt.Backoff{Growth: attempt.Exponential, Initial: n.cfg.RetryBase, Max: limit},
		MaxAttempts: c.MaxAttempts,
	}
}

// retry returns c to PENDING with backoff, or kills it when its attempts
// are used up or the retry would start after its deadline.
func (n *Node) retry(ctx context.Context, c claim, lastErr string) {
	attempts := c.Attempts + 1
	v := n.retryPolicy(c).Decide(attempt.Failure{N: attempts, Retryable: true, Now: n.clock(), Deadline: c.Deadline})
	switch {
	case v.Reason == attempt.OutOfTime:
		n.kill(ctx, c, lastErr+" (deadline passed)")
		return
	case !v.Retry:
		n.kill(ctx, c, lastErr)
		return
	}
	n.m.retried.WithLabelValues(c.Peer).Inc()
	if err := n.outbox.Retry(ctx, c, lastErr, v.At); err != nil {
		n.lg.Warn("return outbox row to PENDING", "row", c.ID, "err", err)
	}
	n.lg.Debug("publish will be retried", "row", c.ID, "nonce", c.Nonce, "attempts", attempts, "in", v.Delay, "err", lastErr)
}

// kill moves c to DEAD; a durable intent still in flight is recorded
// dead_letter in the same transaction.
func (n *Node) kill(ctx context.Context, c claim, lastErr string) {
	var events []tracing.Event
	if c.Owner != string(tracing.OwnerDirectory) {
		if row, ok, err := n.cfg.Log.Intent(ctx, c.Nonce); err == nil && ok &&
			(row.Status == tracing.Dispatched || row.Status == tracing.Delivered || row.Status == tracing.Queued) {
			ev := tracing.Event{Nonce: c.Nonce, State: tracing.DeadLetter, Transport: directory.TransportFederation, Attempt: row.Attempt}
			ev.Details = tracing.Details{ErrorCode: codeUndeliverable, Error: lastErr, Extra: map[string]any{"peer": c.Peer, "outboxId": c.ID}}
			events = append(events, ev)
		}
	}
	err := n.outbox.Kill(ctx, c, lastErr, events...)
	var te *tracing.TransitionError
	if errors.As(err, &te) {
		events = nil
		err = n.outbox.Kill(ctx, c, lastErr)
	}
	if errors.Is(err, errUnrecordable) {
		n.lg.Info("outbox row of an acked intent left as it is", "row", c.ID, "nonce", c.Nonce, "err", lastErr)
		return
	}
	if err != nil {
		n.lg.Warn("move outbox row to DEAD", "row", c.ID, "err", err)
		return
	}
	n.m.dead.WithLabelValues(c.Peer).Inc()
	n.lg.Warn("outbox row is dead", "row", c.ID, "nonce", c.Nonce, "peer", c.Peer, "err", lastErr)
	if len(events) > 0 {
		n.busOutcome(c)
	}
}

// busOutcome tells the bus (Config.BusOutcome) of a bus-owned row's outcome.
func (n *Node) busOutcome(c claim) {
	if c.Owner != string(tracing.OwnerBus) {
		return
	}
	if fn := n.cfg.BusOutcome; fn != nil {
		fn(c.Nonce)
	}
}
