package directory

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// replay handles an authentic frame whose nonce the log already has (§2.4):
// conflict, in progress, cached result or cached failure, or a new attempt
// after a retryable failure. inf holds the nonce's claim.
func (d *Directory) replay(ctx context.Context, inf *inflight, f *wire.IntentFrame, sender registry.Agent, row tracing.IntentRow) {
	refuse := func(rerr *RelayError) {
		d.release(inf)
		d.m.relayed.WithLabelValues(outcomeRefused).Inc()
		inf.done(nil, rerr)
	}
	conflict := relayErr(CodeNonceReuse, inf.nonce, "Nonce %s was already used for a different intent", inf.nonce)
	if row.From != inf.from || row.To != inf.to || row.IntentType != inf.intentType {
		refuse(conflict)
		return
	}
	trace, err := d.log.Trace(ctx, inf.nonce)
	if err != nil {
		d.abort(inf, fmt.Errorf("read trace: %w", err))
		return
	}
	if h := storedHash(trace); h != "" && h != inf.hash {
		refuse(conflict)
		return
	}
	// The nonce is taken: admission failures are answered, not recorded.
	if code, msg := d.checkAdmission(f, d.clock()); code != "" {
		refuse(relayErr(code, inf.nonce, "%s", msg))
		return
	}
	inProgress := relayErr(CodeInProgress, inf.nonce, "Intent %s is already in progress", inf.nonce)
	switch row.Status {
	case tracing.Acked:
		d.cached(inf, row.ResultJSON, nil)
	case tracing.Failed, tracing.DeadLetter:
		if row.Status == tracing.Failed && row.Owner == tracing.OwnerDirectory && RetryableCode(row.ErrorCode) {
			d.retry(inf, f, sender, row)
			return
		}
		res := []byte(row.ResultJSON)
		if len(res) == 0 {
			res = wire.FailureResult(inf.nonce, row.ErrorCode, "intent failed", d.clock(), nil)
		}
		if recipientFailure(trace) {
			d.cached(inf, res, nil)
			return
		}
		code := row.ErrorCode
		if code == "" {
			code = CodeResultError
		}
		d.cached(inf, nil, &RelayError{Code: code, Message: failureMessage(res), Nonce: inf.nonce, Result: res})
	case tracing.Delivered:
		if acc := asyncAcceptance(trace); acc != nil {
			d.cached(inf, acc, nil)
			return
		}
		refuse(inProgress)
	default:
		refuse(inProgress)
	}
}

// cached answers a replay with the recorded outcome; nothing is recorded
// and nothing is delivered again.
func (d *Directory) cached(inf *inflight, res []byte, rerr *RelayError) {
	d.release(inf)
	d.m.relayed.WithLabelValues(outcomeReplayed).Inc()
	inf.done(res, rerr)
}

// retry starts a new attempt of a nonce that failed retryably.
func (d *Directory) retry(inf *inflight, f *wire.IntentFrame, sender registry.Agent, row tracing.IntentRow) {
	attempt := row.Attempt + 1
	if attempt < 2 {
		attempt = 2
	}
	inf.attempt = attempt
	q := inf.event(tracing.Queued, inf.origin)
	frame := f.Raw
	if len(frame) == 0 {
		frame, _ = f.DeliveryJSON()
	}
	q.Details = tracing.Details{
		Frame:           frame,
		ClientTimestamp: f.Timestamp,
		TimeoutMs:       inf.timeout.Milliseconds(),
		Extra:           map[string]any{"retry": true, "previousErrorCode": row.ErrorCode, "payloadHash": inf.hash},
	}
	d.route(inf, f, sender, []tracing.Event{q})
}

// storedHash returns the payload hash recorded with the nonce, or "".
func storedHash(trace []tracing.Event) string {
	for _, ev := range trace {
		if h, ok := ev.Details.Extra["payloadHash"].(string); ok {
			return h
		}
	}
	return ""
}

// recipientFailure reports whether the failure that ended the trace was a
// result of the recipient (returned as a 200 result frame), not a failure
// of the directory.
func recipientFailure(trace []tracing.Event) bool {
	var prev tracing.State
	rec := false
	for _, ev := range trace {
		if ev.State == tracing.Failed && prev != tracing.Failed {
			rec = ev.Details.Extra["recipientResult"] == true
		}
		prev = ev.State
	}
	return rec
}

// asyncAcceptance returns the acceptance result of an intent left
// delivered by an async acceptance, or nil.
func asyncAcceptance(trace []tracing.Event) []byte {
	if len(trace) == 0 {
		return nil
	}
	last := trace[len(trace)-1]
	if last.State == tracing.Delivered && last.Details.Extra["asyncAccepted"] == true && len(last.Details.Result) > 0 {
		return last.Details.Result
	}
	return nil
}

// failureMessage returns the error text of a failure result frame.
func failureMessage(res []byte) string {
	var v struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(res, &v) == nil && v.Error != "" {
		return v.Error
	}
	return "intent failed"
}

// maxResultRetries bounds how often a result waits for a busy nonce.
const maxResultRetries = 8

// handleResult takes a result frame a session sent.
func (d *Directory) handleResult(s *session, raw []byte) {
	rf, err := wire.DecodeResultFrame(raw)
	if err != nil {
		d.m.rejected.WithLabelValues(wire.CodeInvalidResult).Inc()
		s.sendError("", wire.CodeInvalidResult, "Invalid result frame: "+frameErrMsg(err))
		return
	}
	d.takeResult(s, rf, "")
}

// takeResult settles the intent rf answers. token is the result's beam/2
// JWS (verified by handleResultJWS), "" for a beam/1 result.
func (d *Directory) takeResult(s *session, rf *wire.ResultFrame, token string) {
	for tries := 0; ; tries++ {
		d.mu.Lock()
		inf := d.claims[rf.Nonce]
		waiting := inf != nil && inf.waiting
		current := d.sessions[s.beamID] == s
		d.mu.Unlock()
		if waiting {
			if inf.to != s.beamID || !current {
				d.refuseResult(s, rf.Nonce)
				return
			}
			if d.settle(inf) {
				d.recordBusAck(inf, rf)
				d.finishWithResult(inf, rf, d.noteResultJWS(inf, token))
				return
			}
			// Settled concurrently (a timeout): record it as a late result.
			break
		}
		if inf == nil {
			break
		}
		if inf.to != "" && inf.to != s.beamID {
			d.refuseResult(s, rf.Nonce)
			return
		}
		// The nonce is claimed for a moment by something that is not
		// waiting for this result (a replay check, a recovery sweep, a
		// late result being recorded): wait for that claim to end, then
		// look again, so the result is never dropped.
		if tries >= maxResultRetries || inf.released == nil {
			d.lg.Warn("result for a nonce that stayed busy ignored", "nonce", rf.Nonce, "from", s.beamID)
			return
		}
		select {
		case <-inf.released:
		case <-time.After(appendTimeout):
		}
	}
	d.lateResult(s, rf, token)
}

func (d *Directory) refuseResult(s *session, nonce string) {
	d.m.rejected.WithLabelValues(CodeForbidden).Inc()
	d.lg.Warn("result refused: not from the addressed recipient", "nonce", nonce, "session", s.beamID)
	s.sendError(nonce, CodeForbidden, fmt.Sprintf("Result for %s refused: %s is not its recipient", nonce, s.beamID))
}

// lateResult records a result that arrived with no waiter: after a timeout
// (failed → failed annotation) or after a restart (delivered → acked or
// failed), always with lateResult:true.
func (d *Directory) lateResult(s *session, rf *wire.ResultFrame, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	row, ok, err := d.log.Intent(ctx, rf.Nonce)
	if err != nil {
		d.lg.Error("late result: look up nonce", "nonce", rf.Nonce, "err", err)
		return
	}
	if !ok {
		d.m.rejected.WithLabelValues("UNKNOWN_NONCE").Inc()
		d.lg.Info("result for an unknown nonce ignored", "nonce", rf.Nonce, "session", s.beamID)
		return
	}
	if row.To != s.beamID {
		d.refuseResult(s, rf.Nonce)
		return
	}
	if row.Owner != tracing.OwnerDirectory {
		if d.ownersLateResult(s.beamID, rf) {
			return
		}
		d.lg.Info("late result for a bus message ignored", "nonce", rf.Nonce)
		return
	}
	inf := &inflight{nonce: row.Nonce, from: row.From, to: row.To, intentType: row.IntentType, attempt: row.Attempt,
		start: d.clock(), done: func([]byte, *RelayError) {}}
	if row.RequestedAt > 0 {
		inf.start = row.RequestedTime()
	}
	if rerr := d.claim(inf); rerr != nil {
		// Claimed in the meantime: start over, so the result is recorded
		// once that claim ends.
		d.takeResult(s, rf, token)
		return
	}
	defer d.release(inf)
	extra := map[string]any{"lateResult": true}
	if token != "" {
		extra["resultJWS"], extra["resultProtocol"] = token, ProtocolBeam2
	}
	var ev tracing.Event
	switch row.Status {
	case tracing.Delivered:
		// Recovered after a restart (or accepted asynchronously earlier):
		// the result finalizes the same nonce.
		d.mu.Lock()
		delete(d.recovered, row.Nonce)
		inf.transport = row.Transport
		inf.delivered = true
		inf.finished = true
		d.mu.Unlock()
		d.finishWithResult(inf, rf, extra)
		return
	case tracing.Failed, tracing.DeadLetter:
		ev = inf.event(row.Status, row.Transport)
		ev.Details.Extra = map[string]any{"lateResult": true, "lateSuccess": rf.Success, "lateResultFrame": json.RawMessage(rf.Raw)}
		if rf.ErrorCode != "" {
			ev.Details.Extra["lateErrorCode"] = rf.ErrorCode
		}
		if token != "" {
			ev.Details.Extra["lateResultJWS"] = token
		}
	default:
		d.lg.Info("late result ignored", "nonce", rf.Nonce, "status", row.Status)
		return
	}
	if err := d.append(ev); err != nil {
		d.lg.Warn("record late result", "nonce", rf.Nonce, "err", err)
	}
}

func frameErrMsg(err error) string {
	if fe, ok := err.(*wire.FrameError); ok {
		if fe.Field != "" {
			return fe.Field + ": " + fe.Msg
		}
		return fe.Msg
	}
	return err.Error()
}
