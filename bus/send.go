package bus

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// The send path. A new message to an online local recipient is recorded
// and dispatched in one append (received, dispatched), and to an offline one
// (or one whose attempts are at PerRecipient) received and queued in one
// append; the message row is folded in memory from the committed events
// (tracing.MessageRow.Apply, as the projection folds them), so the send
// reads nothing back from the log on its way to the recipient.
//
// A new nonce is safe to record without a check inside the writer: the
// send holds the directory's claim on it (ClaimNewBusNonce) until the
// received event is committed, and every writer of a new nonce (the
// directory's relay, other sends) claims it first. The log itself refuses
// received after any state but received, so the send looks the nonce up
// only when the directory says the log may hold it in received (the bus
// noted it before, or Recover found it there); otherwise it records
// received at once and answers a refusal as a resend, as the relay does.

// accept records a new message (or answers a resend of one) and starts its
// first attempt.
func (b *Bus) accept(ctx context.Context, req *sendRequest) (int, any, *httpjson.Error) {
	hash := payloadHash(req.payload)
	release, lookup, rerr := b.dir.ClaimNewBusNonce(req.nonce, req.from, req.to, req.intent)
	if rerr != nil {
		return 0, nil, httpjson.Errorf(http.StatusConflict, rerr.Code, "%s", rerr.Message)
	}
	if lookup {
		// The log may hold the nonce in received, where a second received
		// would pass as an annotation: look it up first.
		exists, err := b.nonceExists(ctx, req.nonce)
		if err != nil {
			release()
			b.lg.Error("bus: look up nonce", "nonce", req.nonce, "err", err)
			return 0, nil, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "look up nonce failed")
		}
		if exists {
			release()
			return b.resend(ctx, req, hash)
		}
	}
	ev := tracing.Event{Nonce: req.nonce, State: tracing.Received, From: req.from, To: req.to, IntentType: req.intent,
		Transport: transportBus}
	ev.Details = tracing.Details{
		Owner: tracing.OwnerBus,
		Bus: &tracing.BusMessage{MessageID: newMessageID(), Payload: req.payload, Priority: req.priority,
			MaxRetries: b.cfg.MaxAttempts, TraceID: req.traceID},
		Extra: map[string]any{"payloadHash": hash, "auth": req.auth},
	}
	if req.frame != nil && req.auth == directory.BusAuthSignature {
		frame := req.frame.Raw
		if len(frame) == 0 {
			frame, _ = req.frame.DeliveryJSON()
		}
		ev.Details.Frame = frame
		ev.Details.ClientTimestamp = req.frame.Timestamp
	}
	return b.record(ctx, req, ev, hash, release)
}

// resend answers a send whose nonce the log already has.
func (b *Bus) resend(ctx context.Context, req *sendRequest, hash string) (int, any, *httpjson.Error) {
	ir, ok, err := b.log.Intent(ctx, req.nonce)
	if err != nil || !ok {
		return 0, nil, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "look up nonce failed")
	}
	return b.dedupe(ctx, ir, req, hash)
}

// existed reports whether err is the log's refusal of a received event
// because its nonce already has a state (other than received).
func existed(err error) bool {
	var te *tracing.TransitionError
	return errors.As(err, &te) && te.To == tracing.Received && te.From != ""
}

// plan is what a send records together with its received event.
type plan int

const (
	planNone    plan = iota // received alone; the first attempt reads it back (peer recipient)
	planWaiting             // received, queued: the recipient is offline or its attempts are at the limit
	planDeliver             // received, dispatched: the first WebSocket attempt
)

// record writes the received event of a new message, with the first step
// of its delivery when the recipient is a local agent, releases the nonce's
// claim, and starts the attempt.
func (b *Bus) record(ctx context.Context, req *sendRequest, received tracing.Event, hash string, release func()) (int, any, *httpjson.Error) {
	nonce := req.nonce
	unlock := b.keys.Lock(nonce)
	events := []tracing.Event{received}
	how := planNone
	var frame *wire.IntentFrame
	var senderKey string
	sender, senderOK := b.reg.Get(req.from)
	if _, local := b.reg.Get(req.to); local && senderOK {
		base := tracing.MessageRow{Nonce: nonce, Sender: req.from, Recipient: req.to, Intent: req.intent}
		switch {
		case !b.dir.Online(req.to):
			how = planWaiting
		case !b.reserve(req.to):
			how = planWaiting
		default:
			how = planDeliver
			senderKey = sender.PublicKeyB64
			frame = req.frame
			if frame == nil || req.auth != directory.BusAuthSignature {
				frame = wire.NewIntentFrame(req.from, req.to, req.intent, req.payload, b.clock())
				frame.Nonce = nonce
			}
		}
		switch how {
		case planWaiting:
			q := event(base, tracing.Queued, transportBus, 0)
			q.Details.Extra = map[string]any{"waitingFor": "recipient"}
			events = append(events, q)
		case planDeliver:
			disp := event(base, tracing.Dispatched, transportWS, 1)
			disp.Details.TimeoutMs = b.cfg.DeliveryTimeout.Milliseconds()
			events = append(events, b.dispatchedWith(disp, frame.Signature != "", req.auth))
		}
	}
	var wake <-chan tracing.State
	if how == planDeliver {
		wake = b.waitFor(nonce)
	}
	actx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	committed, err := b.log.Append(actx, events...)
	cancel()
	release()
	if err != nil {
		if how == planDeliver {
			b.unreserve(req.to)
			b.dropWaiter(nonce, wake)
		}
		unlock()
		if existed(err) {
			// A resend of a nonce the log has (the send did not look it
			// up, see accept): answer it as such.
			return b.resend(ctx, req, hash)
		}
		var te *tracing.TransitionError
		if errors.As(err, &te) {
			return 0, nil, httpjson.Errorf(http.StatusConflict, codeInProgress, "nonce %s was recorded concurrently; resend to get its status", nonce)
		}
		var ve *tracing.ValidationError
		if errors.As(err, &ve) {
			// The look-up, had accept made it, would have answered a
			// resend before anything was validated.
			if exists, lerr := b.nonceExists(ctx, nonce); lerr == nil && exists {
				return b.resend(ctx, req, hash)
			}
			return 0, nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "message cannot be recorded: %s", ve.Reason)
		}
		if e := notReplicated(err); e != nil {
			b.lg.Warn("bus: record message", "nonce", nonce, "err", err)
			return 0, nil, e
		}
		b.lg.Error("bus: record message", "nonce", nonce, "err", err)
		return 0, nil, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "message could not be recorded")
	}
	var row tracing.MessageRow
	for _, ev := range committed {
		row.Apply(ev)
	}
	b.lg.Debug("message accepted", "id", row.ID, "nonce", nonce, "from", req.from, "to", req.to, "auth", req.auth)
	switch how {
	case planWaiting:
		b.markQueued(req.to)
		unlock()
		// A slot may have been freed, or the recipient may have attached,
		// while the message was recorded.
		b.kickDrain(req.to, true)
		return http.StatusCreated, b.sendResponse(ctx, row, false), nil
	case planDeliver:
		b.setFlight(row, 1)
		unlock()
		if !b.deliver(row, frame, senderKey, req.auth, 1) {
			// The hand-off failed and was settled: answer what the log has.
			b.dropWaiters(nonce)
			return b.readBack(ctx, nonce)
		}
		return b.answerDelivery(ctx, row, wake)
	}
	unlock()
	if _, err := b.attempt(ctx, nonce); err != nil {
		b.lg.Warn("bus: first attempt", "nonce", nonce, "err", err)
	}
	b.waitSettled(ctx, nonce)
	return b.readBack(ctx, nonce)
}

// answerDelivery waits (at most SendWait) for the first WebSocket attempt
// of row to be delivered and answers the send. A delivered or acked
// attempt is answered from memory; anything else from the log.
func (b *Bus) answerDelivery(ctx context.Context, row tracing.MessageRow, wake <-chan tracing.State) (int, any, *httpjson.Error) {
	deadline := time.NewTimer(b.cfg.SendWait)
	defer deadline.Stop()
	select {
	case st := <-wake:
		if st == tracing.Delivered || st == tracing.Acked {
			row.Status = st
			return http.StatusCreated, b.sendResponse(ctx, row, false), nil
		}
	case <-deadline.C:
		b.dropWaiters(row.Nonce)
	case <-ctx.Done():
		b.dropWaiters(row.Nonce)
	}
	return b.readBack(ctx, row.Nonce)
}

// readBack answers a send with the message as the log has it.
func (b *Bus) readBack(ctx context.Context, nonce string) (int, any, *httpjson.Error) {
	row, ok, err := b.message(ctx, nonce)
	if err != nil || !ok {
		return 0, nil, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "message could not be read back")
	}
	return http.StatusCreated, b.sendResponse(ctx, row, false), nil
}

// waitSettled waits (at most SendWait) while nonce is dispatched over
// WebSocket, so that a send to an online recipient answers delivered.
func (b *Bus) waitSettled(ctx context.Context, nonce string) {
	deadline := time.NewTimer(b.cfg.SendWait)
	defer deadline.Stop()
	for {
		ch := b.waitFor(nonce)
		c, ok, err := b.current(ctx, nonce)
		if err != nil || !ok || c.Status != tracing.Dispatched || c.LeaseOwner != "" ||
			c.Transport == directory.TransportFederation {
			// A federation attempt is owned by the outbox; the peer may be
			// down for long.
			b.dropWaiters(nonce)
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			b.dropWaiters(nonce)
			return
		case <-ctx.Done():
			b.dropWaiters(nonce)
			return
		}
	}
}

// deliver hands WebSocket attempt n of row (recorded as dispatched, its
// recipient's slot reserved, its flight set) to the directory. It reports
// false when the hand-off failed; that is then settled.
func (b *Bus) deliver(row tracing.MessageRow, frame *wire.IntentFrame, senderKey, auth string, n int) bool {
	b.m.attempts.WithLabelValues(transportWS).Inc()
	nonce, recipient := row.Nonce, row.Recipient
	started := true
	b.dir.Deliver(context.Background(), directory.Delivery{
		Frame: frame, SenderKey: senderKey, MessageID: row.ID, Attempt: n, Auth: auth,
		Timeout: b.cfg.DeliveryTimeout, Owner: (*busOwner)(b),
		Done: func(o directory.Outcome) {
			if o.Err != nil {
				// Not started (reported before Deliver returns).
				started = false
				b.unreserve(recipient)
				b.interrupted(nonce, n, o.Err)
				return
			}
			// The slot is held until the outcome is recorded.
			b.onOutcome(nonce, n, o)
			b.unreserve(recipient)
			b.kickDrain(recipient, false)
		},
	})
	return started
}

// notReplicated is the answer to a change the log committed but could not
// put into the cluster's replicated storage (tracing.ErrNotReplicated), or
// refused because another node took this node's log over
// (tracing.ErrFenced): nothing was acknowledged, and the client may try
// again; nil for any other error.
func notReplicated(err error) *httpjson.Error {
	if !errors.Is(err, tracing.ErrNotReplicated) && !errors.Is(err, tracing.ErrFenced) {
		return nil
	}
	e := httpjson.Errorf(http.StatusServiceUnavailable, codeNotReplicated,
		"not acknowledged: the cluster's replicated storage did not confirm it; try again (a resend of the same nonce answers its status, or NONCE_REUSE_CONFLICT on another node: then send a new one)")
	e.RetryAfter = time.Second
	return e
}
