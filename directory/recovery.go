package directory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// Recovery actions recorded in details.recoveryAction.
const (
	recoveryInterrupted         = "interrupted"
	recoveryTimeoutAfterRestart = "timeout_after_restart"
	recoveryTimeoutNoWaiter     = "timeout_without_waiter"
)

// recoveryChunk is the most events Recover writes in one append.
const recoveryChunk = 256

// recoveryReport says what Recover did.
type recoveryReport struct {
	// FailedInterrupted counts received, validated, queued and dispatched
	// intents failed as DELIVERY_FAILED (retryable).
	FailedInterrupted int `json:"failedInterrupted"`
	// ResumedAwaitingResult counts delivered intents left open until their
	// deadline; a late result may still finalize them.
	ResumedAwaitingResult int `json:"resumedAwaitingResult"`
	// TimedOutAwaitingResult counts delivered intents already past their
	// deadline, failed as TIMEOUT.
	TimedOutAwaitingResult int `json:"timedOutAwaitingResult"`
}

// Recover settles the directory-owned intents a previous process left
// unfinished (seed 003): received, validated, queued and dispatched ones
// fail retryably (DELIVERY_FAILED, recoveryAction "interrupted");
// delivered ones stay open until dispatch time + timeoutMs (RelayTimeout
// when none was stored), or fail TIMEOUT ("timeout_after_restart") when
// that is past. Intents accepted asynchronously and bus-owned intents are
// left alone. Run it before serving.
func (d *Directory) Recover(ctx context.Context) (recoveryReport, error) {
	var rep recoveryReport
	rows, err := d.log.NonTerminal(ctx)
	if err != nil {
		return rep, fmt.Errorf("recover: %w", err)
	}
	now := d.clock()
	var events []tracing.Event
	resumed := map[string]time.Time{}
	var inReceived []string
	for _, row := range rows {
		if row.Status == tracing.Received {
			inReceived = append(inReceived, row.Nonce)
		}
		if row.Owner != "" && row.Owner != tracing.OwnerDirectory {
			continue
		}
		ev, deadline, err := d.recoverIntent(ctx, row, now, &rep, nil)
		if err != nil {
			return rep, fmt.Errorf("recover %s: %w", row.Nonce, err)
		}
		if ev != nil {
			events = append(events, *ev)
		}
		if !deadline.IsZero() {
			resumed[row.Nonce] = deadline
		}
	}
	var errs []error
	for len(events) > 0 {
		n := min(len(events), recoveryChunk)
		if err := d.append(events[:n]...); err != nil {
			// One event that no longer applies rejects its whole call;
			// write the others one by one.
			for _, ev := range events[:n] {
				if err := d.append(ev); err != nil {
					errs = append(errs, err)
				}
			}
		}
		events = events[n:]
	}
	d.mu.Lock()
	for nonce, dl := range resumed {
		d.recovered[nonce] = dl
	}
	// Nonces in received (the bus's, or ours if failing them did not
	// work) are looked up before a frame with one of them is recorded.
	for _, nonce := range inReceived {
		d.noteBusReceived(nonce)
	}
	d.mu.Unlock()
	d.lg.Info("recovery", "failedInterrupted", rep.FailedInterrupted, "resumedAwaitingResult", rep.ResumedAwaitingResult,
		"timedOutAwaitingResult", rep.TimedOutAwaitingResult)
	if len(errs) > 0 {
		return rep, fmt.Errorf("recover: %w", errors.Join(errs...))
	}
	return rep, nil
}

// recoverIntent decides what recovery does with row, a directory-owned
// intent another process left unfinished, and counts it in rep: ev is the
// event to record (nil for none); a non-zero deadline says the intent
// stays open until then for its result (Sweep). Received, validated,
// queued and dispatched intents fail retryably; delivered ones wait for
// their result until their deadline, or fail TIMEOUT when it passed; ones
// accepted asynchronously are left alone. from is set when the intent was
// taken over from a dead node (Adopt): its event then has transport
// takeover and names the node, and an intent left waiting gets such an
// event too, which changes nothing else.
func (d *Directory) recoverIntent(ctx context.Context, row tracing.IntentRow, now time.Time, rep *recoveryReport,
	from *tracing.Takeover) (*tracing.Event, time.Time, error) {
	var ev tracing.Event
	var deadline time.Time
	switch row.Status {
	case tracing.Received, tracing.Validated, tracing.Queued, tracing.Dispatched:
		msg := "Delivery was interrupted by a directory restart"
		if from != nil {
			msg = "Delivery was interrupted: its node stopped and was taken over"
		}
		ev = recoveryFailure(row, CodeDeliveryFailed, msg, recoveryInterrupted, now)
		rep.FailedInterrupted++
	case tracing.Delivered:
		trace, err := d.log.Trace(ctx, row.Nonce)
		if err != nil {
			return nil, deadline, err
		}
		if asyncAcceptance(trace) != nil {
			return nil, deadline, nil
		}
		deadline = d.deadline(row, trace)
		if now.Before(deadline) {
			rep.ResumedAwaitingResult++
			if from == nil {
				return nil, deadline, nil
			}
			ev = tracing.Event{Nonce: row.Nonce, State: tracing.Delivered, From: row.From, To: row.To,
				IntentType: row.IntentType, Attempt: row.Attempt}
		} else {
			deadline = time.Time{}
			ev = recoveryFailure(row, CodeTimeout,
				fmt.Sprintf("No result from %s before the directory restarted", row.To), recoveryTimeoutAfterRestart, now)
			rep.TimedOutAwaitingResult++
		}
	default:
		return nil, deadline, nil
	}
	if from != nil {
		ev.Transport, ev.Details.Extra = tracing.TransportTakeover, from.Marker(ev.Details.Extra)
	}
	return &ev, deadline, nil
}

// deadline is when a delivered intent's result is due: the latest dispatch
// plus its stored timeout (RelayTimeout when none).
func (d *Directory) deadline(row tracing.IntentRow, trace []tracing.Event) time.Time {
	timeout := time.Duration(row.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = d.cfg.RelayTimeout
	}
	dispatched := time.UnixMicro(row.UpdatedAt)
	for i := len(trace) - 1; i >= 0; i-- {
		if trace[i].State == tracing.Dispatched {
			dispatched = trace[i].At
			break
		}
	}
	return dispatched.Add(timeout)
}

func recoveryFailure(row tracing.IntentRow, code, msg, action string, now time.Time) tracing.Event {
	return tracing.Event{
		Nonce: row.Nonce, State: tracing.Failed, From: row.From, To: row.To, IntentType: row.IntentType,
		Transport: "recovery", Attempt: row.Attempt,
		Details: tracing.Details{
			ErrorCode: code, Error: msg, Retryable: true,
			Result: wire.FailureResult(row.Nonce, code, msg, now, nil),
			Extra:  map[string]any{"recoveryAction": action, "previousState": string(row.Status)},
		},
	}
}

// Sweep fails the recovered delivered intents whose deadline passed with
// no result (TIMEOUT, recoveryAction "timeout_without_waiter") and returns
// how many it failed. Start runs it every RecoverySweepInterval.
func (d *Directory) Sweep(ctx context.Context) (int, error) {
	now := d.clock()
	d.mu.Lock()
	var due []*inflight
	for nonce, dl := range d.recovered {
		if now.Before(dl) {
			continue
		}
		if _, busy := d.claims[nonce]; busy {
			continue
		}
		inf := &inflight{nonce: nonce, done: func([]byte, *RelayError) {}, released: make(chan struct{})}
		d.claims[nonce] = inf
		delete(d.recovered, nonce)
		due = append(due, inf)
	}
	d.mu.Unlock()
	n := 0
	var errs []error
	for _, inf := range due {
		row, ok, err := d.log.Intent(ctx, inf.nonce)
		if err == nil && ok && row.Status == tracing.Delivered {
			ev := recoveryFailure(row, CodeTimeout, fmt.Sprintf("No result from %s before its deadline", row.To),
				recoveryTimeoutNoWaiter, now)
			if err = d.append(ev); err == nil {
				n++
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
		d.release(inf)
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("recovery sweep: %w", errors.Join(errs...))
	}
	return n, nil
}
