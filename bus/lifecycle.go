package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// Error codes the bus records or answers besides the HTTP ones.
const (
	// codeLeaseExpired: a poll lease ran out without an ack (retryable).
	codeLeaseExpired = "LEASE_EXPIRED"
	// codeConsumerFailed: the consumer acked with status failed.
	codeConsumerFailed = "CONSUMER_FAILED"
	// codeUnknownAgent: the sender or recipient is no longer registered.
	codeUnknownAgent = "UNKNOWN_AGENT"
)

// nonRetryable are the failure codes that dead-letter a message at once:
// retrying cannot change their outcome.
var nonRetryable = map[string]bool{
	"BAD_REQUEST": true, "FORBIDDEN": true, "INVALID_INTENT": true, "NONCE_REUSE_CONFLICT": true,
	"UNAUTHORIZED": true, "UNKNOWN_SENDER": true, codeUnknownAgent: true, "UNSUPPORTED_INTENT": true,
	"FRAME_TOO_LARGE": true, "PAYLOAD_TOO_LARGE": true, codeSignedFrameRequired: true,
	directory.CodeSenderSignatureRequired: true,
}

// retryable reports whether a failed attempt with code is retried on the
// schedule (true) or dead-lettered at once (false).
func retryable(code string) bool { return !nonRetryable[code] }

// errNotFound is returned for a message id or nonce the bus does not have.
var errNotFound = errors.New("bus: message not found")

// stateError is returned when a message is not in a state that allows the
// operation.
type stateError struct {
	MessageID string
	Status    tracing.State
	Op        string
}

func (e *stateError) Error() string {
	return fmt.Sprintf("bus: message %s is %s: cannot %s", e.MessageID, e.Status, e.Op)
}

// reserve counts a WebSocket attempt to recipient; false when its limit is
// reached.
func (b *Bus) reserve(recipient string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.active[recipient] >= b.cfg.PerRecipient {
		return false
	}
	b.active[recipient]++
	return true
}

func (b *Bus) unreserve(recipient string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.active[recipient] <= 1 {
		delete(b.active, recipient)
		return
	}
	b.active[recipient]--
}

func (b *Bus) activeCount(recipient string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active[recipient]
}

// attempt starts a WebSocket delivery attempt of nonce when it is received,
// or queued and due (or waiting for its recipient), and the recipient has a
// session. A message whose recipient is offline is left queued waiting for
// it (no attempt is counted). It reports whether an attempt was started.
func (b *Bus) attempt(ctx context.Context, nonce string) (bool, error) {
	if b.isClosed() {
		return false, nil
	}
	unlock := b.keys.Lock(nonce)
	c, ok, err := b.current(ctx, nonce)
	if err != nil || !ok {
		unlock()
		return false, err
	}
	row, prev := c.MessageRow, c.Attempt
	now := b.clock()
	switch row.Status {
	case tracing.Received:
	case tracing.Queued:
		if row.NextRetryAt != nil && *row.NextRetryAt > secs(now) {
			unlock()
			return false, nil
		}
	default:
		unlock()
		return false, nil
	}
	sender, senderOK := b.reg.Get(row.Sender)
	_, recipientLocal := b.reg.Get(row.Recipient)
	// A message queued before the recipient's registration was for a
	// deleted agent of the same name: a later registrant never gets it.
	recipientLocal = recipientLocal && row.CreatedAt >= b.registeredSince(row.Recipient)
	if !recipientLocal && senderOK {
		if r := b.remoteRouter(); r != nil {
			if peer, ok := r.PeerFor(row.Recipient); ok {
				first, err := b.firstDetails(ctx, nonce)
				if err == nil {
					err = b.forward(r, peer, row, first, prev)
				}
				unlock()
				return err == nil, err
			}
		}
	}
	if !recipientLocal || !senderOK {
		err := b.retry(row, prev, transportBus, codeUnknownAgent, "sender or recipient is no longer registered", nil, nil, nil, false)
		unlock()
		return false, err
	}
	online := b.dir.Online(row.Recipient)
	if !online || !b.reserve(row.Recipient) {
		if row.Status == tracing.Received || (!online && row.NextRetryAt != nil) {
			// Wait for the recipient (offline, or at its limit of attempts
			// in flight: a finished attempt drains its queue).
			ev := event(row, tracing.Queued, transportBus, 0)
			ev.Details.Extra = map[string]any{"waitingFor": "recipient"}
			err = b.append(ev)
		} else {
			b.markQueued(row.Recipient)
		}
		unlock()
		if online && err == nil {
			b.kickDrain(row.Recipient, false)
		}
		return false, err
	}
	if handled, err := b.checkRecord(ctx, row, prev); handled || err != nil {
		b.unreserve(row.Recipient)
		unlock()
		return false, err
	}
	first, err := b.firstDetails(ctx, nonce)
	if err != nil {
		b.unreserve(row.Recipient)
		unlock()
		return false, err
	}
	frame, auth, ferr := b.frameFor(row, first, now)
	if ferr == nil && frame.Signature == "" {
		if rcpt, _ := b.reg.Get(row.Recipient); rcpt.RequireSenderSignatures {
			ferr = errEndToEnd
		}
	}
	if ferr != nil {
		b.unreserve(row.Recipient)
		code, msg := "INVALID_INTENT", ferr.Error()
		if errors.Is(ferr, errEndToEnd) {
			code, msg = directory.CodeSenderSignatureRequired, directory.SenderSignatureRequired(row.Recipient, auth)
		}
		err := b.retry(row, prev, transportBus, code, msg, nil, nil, nil, false)
		unlock()
		return false, err
	}
	n := prev + 1
	disp := event(row, tracing.Dispatched, transportWS, n)
	disp.Details.TimeoutMs = b.cfg.DeliveryTimeout.Milliseconds()
	disp = b.dispatchedWith(disp, frame.Signature != "", auth)
	if err := b.append(disp); err != nil {
		b.unreserve(row.Recipient)
		unlock()
		return false, err
	}
	row.Status, row.NextRetryAt, row.LeaseOwner, row.LeaseExpiresAt = tracing.Dispatched, nil, "", nil
	b.setFlight(row, n)
	unlock()
	return b.deliver(row, frame, sender.PublicKeyB64, auth, n), nil
}

// frameFor returns the frame of an attempt: the sender's signed frame
// verbatim, or an unsigned frame with a fresh timestamp and the same nonce.
func (b *Bus) frameFor(row tracing.MessageRow, first tracing.Details, now time.Time) (*wire.IntentFrame, string, error) {
	auth, _ := first.Extra["auth"].(string)
	if auth == directory.BusAuthSignature && len(first.Frame) > 0 {
		f, err := wire.DecodeIntentFrame(first.Frame)
		if err != nil {
			return nil, "", fmt.Errorf("stored frame: %w", err)
		}
		return f, auth, nil
	}
	if auth == "" {
		auth = directory.BusAuthAPIKey
	}
	f := wire.NewIntentFrame(row.Sender, row.Recipient, row.Intent, json.RawMessage(row.Payload), now)
	f.Nonce = row.Nonce
	return f, auth, nil
}

// busOwner is the bus as the owner of its messages' nonces: the directory
// hands it the WebSocket attempts whose frames were written, and it
// appends their delivered events (directory.Owner).
type busOwner Bus

// Delivered appends delivered for written attempts in one append, then
// records their delivery latency and wakes the sends waiting for them. The
// attempts stay in flight: their outcome (directory.Outcome.Delivered)
// follows.
func (o *busOwner) Delivered(ws []directory.Written) error {
	b := (*Bus)(o)
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	if _, err := b.log.Append(ctx, directory.DeliveredEvents(ws)...); err != nil {
		return fmt.Errorf("record delivered of %s: %w", ws[0].Nonce, err)
	}
	for _, w := range ws {
		b.mu.Lock()
		f, ok := b.flights[w.Nonce]
		b.mu.Unlock()
		if ok {
			b.observeDelivery(f.row)
		}
		b.signal(w.Nonce, tracing.Delivered)
	}
	return nil
}

// observeDelivery records the time from row's send to its delivery.
func (b *Bus) observeDelivery(row tracing.MessageRow) {
	lat := b.clock().Sub(time.UnixMicro(int64(row.CreatedAt * 1e6)))
	b.m.latency.Observe(max(lat.Seconds(), 0))
}

// interrupted settles an attempt the directory could not start.
func (b *Bus) interrupted(nonce string, n int, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	unlock := b.keys.Lock(nonce)
	defer unlock()
	if _, ok := b.takeFlight(nonce, n); !ok {
		return
	}
	c, ok, err := b.current(ctx, nonce)
	if err != nil || !ok || c.Status != tracing.Dispatched || c.Attempt != n {
		return
	}
	row := c.MessageRow
	switch {
	case errors.Is(cause, directory.ErrRecipientOffline):
		// Not an attempt: the recipient left between the check and the
		// hand-off. Wait for it again; the attempt number is reused.
		ev := event(row, tracing.Queued, transportBus, n-1)
		ev.Details.Extra = map[string]any{"waitingFor": "recipient", "interrupted": "offline"}
		if err := b.append(ev); err != nil {
			b.lg.Warn("requeue after offline hand-off", "nonce", nonce, "err", err)
		}
	case errors.Is(cause, directory.ErrNonceBusy):
		ev := event(row, tracing.Queued, transportBus, n-1)
		ev.Details.NextRetryAt = b.clock().Add(time.Second).UnixMilli()
		ev.Details.Extra = map[string]any{"interrupted": "nonce busy"}
		if err := b.append(ev); err != nil {
			b.lg.Warn("requeue after busy nonce", "nonce", nonce, "err", err)
		}
	default:
		if err := b.retry(row, n, transportWS, directory.CodeDeliveryFailed, cause.Error(), nil, nil, nil, false); err != nil {
			b.lg.Warn("record failed hand-off", "nonce", nonce, "err", err)
		}
	}
}

// onOutcome records how WebSocket attempt n of nonce ended. The message is
// taken from the attempt's flight: while it is set, nothing but the
// directory's delivered event (reported by o.Delivered) changed the
// message in the log.
func (b *Bus) onOutcome(nonce string, n int, o directory.Outcome) {
	unlock := b.keys.Lock(nonce)
	defer unlock()
	f, ok := b.takeFlight(nonce, n)
	if !ok {
		b.lg.Info("bus outcome for a settled attempt ignored", "nonce", nonce, "attempt", n)
		return
	}
	row := f.row
	if o.Delivered {
		row.Status = tracing.Delivered
	} else if o.Written {
		// delivered is written below, with the outcome.
		b.observeDelivery(row)
	}
	var err error
	if o.Recorded != nil {
		err = b.settleRecorded(row, n, *o.Recorded)
	} else if o.Result != nil {
		// A dispatched row gets delivered in the same append as the result.
		err = b.applyResult(row, n, transportWS, o.Result, nil)
	} else {
		var pre []tracing.Event
		if o.Written && row.Status == tracing.Dispatched {
			pre = append(pre, event(row, tracing.Delivered, transportWS, n))
		}
		var extra map[string]any
		if o.SessionProtocol != "" {
			extra = map[string]any{"sessionProtocol": o.SessionProtocol, "sessionAuth": o.SessionAuth}
			if o.ErrorCode == directory.CodeTimeout {
				extra["noAnswer"] = true
			}
		}
		err = b.retry(row, n, transportWS, o.ErrorCode, o.Error, pre, extra, nil, false)
	}
	if err != nil {
		var te *tracing.TransitionError
		if errors.As(err, &te) {
			b.lg.Info("bus outcome for a message that changed state ignored", "nonce", nonce, "attempt", n, "err", err)
			return
		}
		b.lg.Warn("bus outcome: record", "nonce", nonce, "err", err)
	}
}

// applyResult records a recipient's result for row (dispatched or
// delivered): an async acceptance leaves it delivered, a success acks it, a
// failure retries or dead-letters it. The caller holds the nonce's lock.
func (b *Bus) applyResult(row tracing.MessageRow, n int, transport string, rf *wire.ResultFrame, extra map[string]any) error {
	now := b.clock()
	var pre []tracing.Event
	if row.Status == tracing.Dispatched {
		pre = append(pre, event(row, tracing.Delivered, transport, n))
	}
	lat := latencyMs(row, now)
	switch {
	case wire.IsAsyncAcceptance(rf):
		ev := event(row, tracing.Delivered, transport, n)
		ev.Details = tracing.Details{Result: rf.Raw, Extra: with(extra, "asyncAccepted", true)}
		if err := b.append(append(pre, ev)...); err != nil {
			return err
		}
		b.m.outcomes.WithLabelValues("accepted").Inc()
		return nil
	case rf.Success:
		ev := event(row, tracing.Acked, transport, n)
		ev.Details = tracing.Details{Result: rf.Raw, Response: objectOrNil(rf.Payload), LatencyMs: lat, Extra: extra}
		if err := b.append(append(pre, ev)...); err != nil {
			return err
		}
		b.forget(row.Nonce)
		b.m.outcomes.WithLabelValues(string(tracing.Acked)).Inc()
		b.notifySender(row, tracing.Acked, rf.Raw)
		return nil
	default:
		code := rf.ErrorCode
		if code == "" {
			code = directory.CodeResultError
		}
		msg := rf.Error
		if msg == "" {
			msg = "the recipient answered with a failure"
		}
		return b.retry(row, n, transport, code, msg, pre, with(extra, "recipientResult", true), rf.Raw, false)
	}
}

// retry records a failed attempt n of row: queued for the next attempt on
// the schedule (at once when immediate), or dead_letter when code is not
// retryable or the attempts are used up. pre are events to write first in
// the same append. The caller holds the nonce's lock.
func (b *Bus) retry(row tracing.MessageRow, n int, transport, code, msg string, pre []tracing.Event, extra map[string]any, result []byte, immediate bool) error {
	now := b.clock()
	count := row.RetryCount + 1
	// MaxRetries counts every attempt; a row without one gets a single one.
	policy := attempt.Policy{Backoff: b.backoff, MaxAttempts: max(row.MaxRetries, 1)}
	v := policy.Decide(attempt.Failure{N: count, Retryable: retryable(code), Now: now,
		Draw: nonceDraw(row.Nonce, count, b.cfg.Jitter)})
	if !v.Retry {
		if len(result) == 0 {
			result = wire.FailureResult(row.Nonce, code, msg, now, nil)
		}
		ev := event(row, tracing.DeadLetter, transport, n)
		ev.Details = tracing.Details{ErrorCode: code, Error: msg, RetryCount: &count, Result: result,
			LatencyMs: latencyMs(row, now), Extra: extra}
		if err := b.append(append(pre, ev)...); err != nil {
			return err
		}
		b.forget(row.Nonce)
		b.m.deadLetters.Inc()
		b.m.outcomes.WithLabelValues(string(tracing.DeadLetter)).Inc()
		b.lg.Info("message dead-lettered", "nonce", row.Nonce, "id", row.ID, "code", code, "attempts", count)
		b.notifySender(row, tracing.DeadLetter, result)
		return nil
	}
	next := v.At
	if immediate {
		next = now
	}
	ev := event(row, tracing.Queued, transportBus, n)
	ev.Details = tracing.Details{ErrorCode: code, Error: msg, Retryable: true, RetryCount: &count,
		NextRetryAt: next.UnixMilli(), Extra: extra}
	if err := b.append(append(pre, ev)...); err != nil {
		return err
	}
	b.m.retries.Inc()
	return nil
}

// LateResult takes a result beamID sent for a bus message that no attempt
// of this process waits for: a delivered message (recovered after a
// restart, timed out, or accepted asynchronously) is settled with it. It
// reports false when nonce is no bus message (directory.SessionOwner).
func (b *Bus) LateResult(beamID string, rf *wire.ResultFrame) bool {
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	unlock := b.keys.Lock(rf.Nonce)
	defer unlock()
	c, ok, err := b.current(ctx, rf.Nonce)
	if err != nil || !ok {
		return false
	}
	row, n := c.MessageRow, c.Attempt
	if row.Recipient != beamID || row.Status != tracing.Delivered {
		b.lg.Info("late result for a bus message ignored", "nonce", rf.Nonce, "from", beamID, "status", row.Status)
		return true
	}
	if err := b.applyResult(row, n, transportWS, rf, map[string]any{"lateResult": true}); err != nil {
		b.lg.Warn("late result: record", "nonce", rf.Nonce, "err", err)
	}
	return true
}

// forget drops a nonce from the recovered set.
func (b *Bus) forget(nonce string) {
	b.mu.Lock()
	b.recovered.Remove(nonce)
	b.mu.Unlock()
}

// RecoveryReport says what Recover (or Adopt) did.
type RecoveryReport struct {
	// Requeued counts received and dispatched messages requeued at once.
	Requeued int `json:"requeued"`
	// AwaitingResult counts delivered messages (not accepted
	// asynchronously) whose result may still arrive until their deadline.
	AwaitingResult int `json:"awaitingResult"`
	// Adopted counts the messages Adopt took over (every kind).
	Adopted int `json:"adopted,omitempty"`
}

// Recover applies the restart rules (seed 003) to the messages a previous
// process left: received and dispatched ones are requeued at once with the
// same nonce (retry_count kept); queued ones keep next_retry_at; delivered,
// acked, failed and dead_letter ones are unchanged. Delivered messages that
// still wait for a WebSocket result get DeliveryTimeout from their delivery
// to receive it; after that Tick retries them as TIMEOUT. Run it before
// serving.
func (b *Bus) Recover(ctx context.Context) (RecoveryReport, error) {
	var rep RecoveryReport
	nonces, err := b.log.InterruptedMessages(ctx)
	if err != nil {
		return rep, fmt.Errorf("bus recover: %w", err)
	}
	var errs []error
	for _, nonce := range nonces {
		unlock := b.keys.Lock(nonce)
		c, ok, err := b.current(ctx, nonce)
		if err == nil && ok {
			var requeued bool
			if requeued, err = b.requeueInterrupted(c, restart); requeued {
				rep.Requeued++
			}
		}
		unlock()
		if err != nil {
			errs = append(errs, err)
		}
	}
	delivered, err := b.log.DeliveredMessages(ctx)
	if err != nil {
		return rep, fmt.Errorf("bus recover: %w", err)
	}
	for _, p := range delivered {
		awaiting, err := b.awaitResult(ctx, p.Nonce, p.At, restart)
		if err != nil {
			errs = append(errs, err)
		}
		if awaiting {
			rep.AwaitingResult++
		}
	}
	b.lg.Info("bus recovery", "requeued", rep.Requeued, "awaitingResult", rep.AwaitingResult)
	return rep, errors.Join(errs...)
}

// recovery is how the bus recovers messages another process left
// unfinished: restart (Recover, this log's own process stopped) or a
// takeover (Adopt, a dead node's log was imported).
type recovery struct {
	transport string
	why       string // details.error of a requeue
	action    string // details.extra.recoveryAction of a requeue
	// from, for a takeover, is where the message was taken over from.
	from *tracing.Takeover
}

var restart = recovery{transport: "recovery", why: "Recovered after a restart", action: "requeued_after_restart"}

// requeueInterrupted requeues c, a message left received, validated or
// dispatched, at once with the same nonce and attempt; it reports whether
// it did. At a restart a federation attempt is left to the outbox, which
// publishes it again; at a takeover the outbox row stayed with the dead
// node, so the message is forwarded again (the peer deduplicates its
// nonce). The caller holds the nonce's lock.
func (b *Bus) requeueInterrupted(c current, how recovery) (bool, error) {
	row := c.MessageRow
	if row.Status == tracing.Dispatched && c.Transport == directory.TransportFederation && how.from == nil {
		return false, nil
	}
	if row.Status != tracing.Received && row.Status != tracing.Validated && row.Status != tracing.Dispatched {
		return false, nil
	}
	ev := event(row, tracing.Queued, how.transport, c.Attempt)
	extra := map[string]any{"recoveryAction": how.action, "previousState": string(row.Status)}
	if how.from != nil {
		extra = how.from.Marker(extra)
	}
	ev.Details = tracing.Details{NextRetryAt: b.nowMs(), Error: how.why, Extra: extra}
	if err := b.append(ev); err != nil {
		return false, err
	}
	return true, nil
}

// awaitResult gives nonce, a message delivered at (epoch seconds) whose
// result has not come, until at+DeliveryTimeout to receive it (Tick
// retries it as TIMEOUT after that); it reports whether it did. A message
// accepted asynchronously waits for its late result without a deadline; at
// a restart, one forwarded to a peer directory waits for the outbox to
// report the peer's outcome.
func (b *Bus) awaitResult(ctx context.Context, nonce string, at float64, how recovery) (bool, error) {
	last, err := b.lastDetails(ctx, nonce)
	if err != nil {
		return false, err
	}
	if last.Extra["asyncAccepted"] == true || (how.from == nil && b.viaFederation(ctx, nonce)) {
		return false, nil
	}
	b.mu.Lock()
	b.recovered.Set(nonce, time.UnixMicro(int64(at*1e6)).Add(b.cfg.DeliveryTimeout))
	b.mu.Unlock()
	return true, nil
}

// Tick runs one round of the worker: expired poll leases go back to
// queued (the attempt counted), recovered deliveries past their deadline
// are retried as TIMEOUT, and due queued messages are attempted. Start calls
// it every TickInterval; tests call it after moving the clock.
func (b *Bus) Tick(ctx context.Context) error {
	now := b.clock()
	var errs []error
	expired, err := b.log.ExpiredLeases(ctx, secs(now), b.cfg.Batch)
	if err != nil {
		return fmt.Errorf("bus tick: %w", err)
	}
	for _, nonce := range expired {
		if err := b.expireLease(ctx, nonce); err != nil {
			errs = append(errs, err)
		}
	}
	b.mu.Lock()
	overdue := b.recovered.PopDue(now, 0)
	b.mu.Unlock()
	for _, nonce := range overdue {
		if err := b.timeoutRecovered(ctx, nonce); err != nil {
			errs = append(errs, err)
		}
	}
	due, err := b.log.DueMessages(ctx, secs(now), b.cfg.Batch)
	if err != nil {
		return fmt.Errorf("bus tick: %w", err)
	}
	for _, nonce := range due {
		if _, err := b.attempt(ctx, nonce); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// expireLease returns a leased message whose lease ran out to queued, due
// at once, with the attempt counted (or dead-letters it).
func (b *Bus) expireLease(ctx context.Context, nonce string) error {
	unlock := b.keys.Lock(nonce)
	defer unlock()
	c, ok, err := b.current(ctx, nonce)
	if err != nil || !ok {
		return err
	}
	row, n := c.MessageRow, c.Attempt
	if row.Status != tracing.Dispatched || row.LeaseExpiresAt == nil || *row.LeaseExpiresAt > secs(b.clock()) {
		return nil
	}
	b.m.leasesExpired.Inc()
	return b.retry(row, n, transportPoll, codeLeaseExpired, "poll lease expired without an ack", nil,
		map[string]any{"expiredLease": row.LeaseOwner}, nil, true)
}

// timeoutRecovered retries a message recovered as delivered whose result
// did not come in time.
func (b *Bus) timeoutRecovered(ctx context.Context, nonce string) error {
	b.forget(nonce)
	unlock := b.keys.Lock(nonce)
	defer unlock()
	c, ok, err := b.current(ctx, nonce)
	row, n := c.MessageRow, c.Attempt
	if err != nil || !ok || row.Status != tracing.Delivered {
		return err
	}
	last, err := b.lastDetails(ctx, nonce)
	if err != nil {
		return err
	}
	if last.Extra["asyncAccepted"] == true {
		return nil
	}
	return b.retry(row, n, "recovery", directory.CodeTimeout, "No result from "+row.Recipient+" after the directory restarted", nil,
		map[string]any{"recoveryAction": "timeout_after_restart"}, nil, false)
}

// AgentConnected delivers the messages waiting for beamID. The directory
// calls it when the agent attaches a session.
func (b *Bus) AgentConnected(beamID string) { b.kickDrain(beamID, true) }

// kickDrain runs drain for recipient in the background, at most once at a
// time per recipient (a request during a run makes it run again). Without
// force it does so only when recipient may have queued messages.
func (b *Bus) kickDrain(recipient string, force bool) {
	b.mu.Lock()
	if b.closed || (!force && !b.queuedFor[recipient]) {
		b.mu.Unlock()
		return
	}
	if _, running := b.draining[recipient]; running {
		b.draining[recipient] = true
		b.mu.Unlock()
		return
	}
	b.draining[recipient] = false
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		for {
			b.drain(recipient)
			b.mu.Lock()
			if !b.draining[recipient] || b.closed {
				delete(b.draining, recipient)
				b.mu.Unlock()
				return
			}
			b.draining[recipient] = false
			b.mu.Unlock()
		}
	}()
}

// drain attempts the queued messages of an online recipient that are
// waiting for it or due, within its in-flight limit.
func (b *Bus) drain(recipient string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 1000 {
		if b.isClosed() || !b.dir.Online(recipient) {
			return
		}
		free := b.cfg.PerRecipient - b.activeCount(recipient)
		if free <= 0 {
			return
		}
		// Cleared before the query: a message queued after it marks the
		// recipient again.
		b.mu.Lock()
		delete(b.queuedFor, recipient)
		b.mu.Unlock()
		nonces, err := b.waitingFor(ctx, recipient, secs(b.clock()), free)
		if err != nil {
			b.markQueued(recipient)
			b.lg.Warn("bus drain", "recipient", recipient, "err", err)
			return
		}
		if len(nonces) == free {
			// There may be more than one query's worth.
			b.markQueued(recipient)
		}
		started := 0
		for _, nonce := range nonces {
			ok, err := b.attempt(ctx, nonce)
			if err != nil {
				b.lg.Warn("bus drain attempt", "nonce", nonce, "err", err)
			}
			if ok {
				started++
			}
		}
		if started == 0 {
			return
		}
	}
}

// Requeue moves a dead-lettered or failed message back to queued with its
// retry count reset and the same nonce, and delivers it at once when its
// recipient is online. It returns errNotFound or a *stateError.
func (b *Bus) Requeue(ctx context.Context, messageID string) error {
	nonce, ok, err := b.nonceOfID(ctx, messageID)
	if err != nil {
		return err
	}
	if !ok {
		return errNotFound
	}
	unlock := b.keys.Lock(nonce)
	c, ok, err := b.current(ctx, nonce)
	row := c.MessageRow
	if err != nil || !ok {
		unlock()
		if err == nil {
			err = errNotFound
		}
		return err
	}
	if row.Status != tracing.DeadLetter && row.Status != tracing.Failed {
		unlock()
		return &stateError{MessageID: messageID, Status: row.Status, Op: "requeue (only dead_letter or failed)"}
	}
	zero := 0
	ev := event(row, tracing.Queued, transportBus, c.Attempt)
	ev.Details = tracing.Details{RetryCount: &zero, Extra: map[string]any{"requeued": true, "previousState": string(row.Status)}}
	err = b.append(ev)
	unlock()
	if err != nil {
		return err
	}
	b.m.requeues.Inc()
	b.lg.Info("message requeued", "id", messageID, "nonce", nonce, "previousState", row.Status)
	_, err = b.attempt(ctx, nonce)
	return err
}

// claimLeases hands out up to limit queued messages of agent under one new
// poll lease: each becomes dispatched (transport poll) with the lease owner
// and expiry recorded, and counts as an attempt.
func (b *Bus) claimLeases(ctx context.Context, agent string, limit int, lease time.Duration) ([]tracing.MessageRow, error) {
	now := b.clock()
	nonces, err := b.waitingFor(ctx, agent, secs(now), limit)
	if err != nil {
		return nil, err
	}
	leaseID := newLeaseID()
	exp := now.Add(lease)
	var out []tracing.MessageRow
	for _, nonce := range nonces {
		row, ok, err := b.claimOne(ctx, nonce, leaseID, exp, lease)
		if err != nil {
			return out, err
		}
		if ok {
			out = append(out, row)
		}
	}
	return out, nil
}

func (b *Bus) claimOne(ctx context.Context, nonce, leaseID string, exp time.Time, lease time.Duration) (tracing.MessageRow, bool, error) {
	unlock := b.keys.Lock(nonce)
	defer unlock()
	c, ok, err := b.current(ctx, nonce)
	row, n := c.MessageRow, c.Attempt
	if err != nil || !ok || row.Status != tracing.Queued || (row.NextRetryAt != nil && *row.NextRetryAt > secs(b.clock())) {
		return tracing.MessageRow{}, false, err
	}
	if handled, err := b.checkRecord(ctx, row, n); handled || err != nil {
		return tracing.MessageRow{}, false, err
	}
	if code, msg, err := b.pollPolicy(ctx, row); err != nil || code != "" {
		if err == nil {
			// Refused as the door refuses a WebSocket attempt: not handed
			// out, and not retryable.
			err = b.retry(row, n, transportPoll, code, msg, nil, nil, nil, false)
		}
		return tracing.MessageRow{}, false, err
	}
	ev := event(row, tracing.Dispatched, transportPoll, n+1)
	ev.Details = tracing.Details{LeaseOwner: leaseID, LeaseExpiresAt: exp.UnixMilli(), TimeoutMs: lease.Milliseconds()}
	if err := b.append(ev); err != nil {
		return tracing.MessageRow{}, false, err
	}
	b.m.attempts.WithLabelValues(transportPoll).Inc()
	row, ok, err = b.message(ctx, nonce)
	return row, ok, err
}

// pollPolicy applies the recipient's policy to a message about to be
// leased to a poll, as directory.Deliver applies it to every WebSocket
// attempt: its ACL now, and its end-to-end rule for an unsigned frame. It
// reads how the sender was authenticated only when the recipient requires
// sender signatures.
func (b *Bus) pollPolicy(ctx context.Context, row tracing.MessageRow) (code, msg string, err error) {
	if code, msg = b.dir.CheckDelivery(row.Sender, row.Recipient, row.Intent, true, ""); code != "" {
		return code, msg, nil
	}
	if rcpt, ok := b.reg.Get(row.Recipient); !ok || !rcpt.RequireSenderSignatures {
		return "", "", nil
	}
	first, err := b.log.FirstDetails(ctx, row.Nonce)
	if err != nil {
		return "", "", fmt.Errorf("poll policy of %s: %w", row.Nonce, err)
	}
	auth, _ := first.Extra["auth"].(string)
	signed := auth == directory.BusAuthSignature && len(first.Frame) > 0
	if auth == "" {
		auth = directory.BusAuthAPIKey
	}
	code, msg = b.dir.CheckDelivery(row.Sender, row.Recipient, row.Intent, signed, auth)
	return code, msg, nil
}

func newLeaseID() string {
	var raw [12]byte
	_, _ = rand.Read(raw[:])
	return "lease_" + hex.EncodeToString(raw[:])
}

func latencyMs(row tracing.MessageRow, now time.Time) *int64 {
	ms := now.Sub(time.UnixMicro(int64(row.CreatedAt * 1e6))).Milliseconds()
	if ms < 0 {
		ms = 0
	}
	return &ms
}

func with(extra map[string]any, key string, v any) map[string]any {
	out := make(map[string]any, len(extra)+1)
	for k, x := range extra {
		out[k] = x
	}
	out[key] = v
	return out
}

// objectOrNil returns raw when it is a JSON object, else nil.
func objectOrNil(raw json.RawMessage) json.RawMessage {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return raw
		}
		return nil
	}
	return nil
}
