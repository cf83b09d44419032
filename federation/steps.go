package federation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// Outbox steps in the log. Every transition of an outbox row is an event
// of the row's intent (its nonce), in the transaction that changes the
// row: details.outbox holds the row's fields after the step (Step). The
// PENDING step of a new row rides on the event that needs the publish (the
// dispatched event), PUBLISHED on the outcome event (delivered, acked,
// failed), DEAD on a durable intent's dead_letter; the others (CLAIMED, a
// retry or a reaped claim back to PENDING, an operator's replay, DEAD of a
// sync intent) are annotations: an event in the intent's current state.
// So `beam trace <nonce>` shows where a cross-directory message is, and
// RebuildOutbox refolds federation_outbox from the log.
//
// An acked intent takes no annotation (acked is final), so a row whose
// intent is already acked is finished: it is not claimed, reaped or
// replayed again (its peer's outcome is committed), and stays as the log
// last recorded it.

// step is details.outbox of an event: an outbox row after one transition.
// Times are unix microseconds (0: unset).
type step struct {
	EventID     string      `json:"eventId"`
	State       OutboxState `json:"state"`
	Peer        string      `json:"peer"`
	Attempts    int         `json:"attempts"`
	LastError   string      `json:"lastError,omitempty"`
	AvailableAt int64       `json:"availableAt"`
	Deadline    int64       `json:"deadline,omitempty"`
	ClaimedAt   int64       `json:"claimedAt,omitempty"`
	ClaimedBy   string      `json:"claimedBy,omitempty"`
	PublishedAt int64       `json:"publishedAt,omitempty"`
	At          int64       `json:"at"`
	// Replay marks an operator's replay to PENDING.
	Replay bool `json:"replay,omitempty"`
	// The immutable fields, on the step that creates the row.
	Kind        string          `json:"kind,omitempty"`
	Owner       string          `json:"owner,omitempty"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	MaxAttempts int             `json:"maxAttempts,omitempty"`
	CreatedAt   int64           `json:"createdAt,omitempty"`
}

// stepOf is the step that leaves a row as r (created: with the immutable
// fields).
func stepOf(r Row, created bool) step {
	s := step{EventID: r.EventID, State: r.State, Peer: r.Peer, Attempts: r.Attempts, LastError: r.LastError,
		AvailableAt: usOrZero(r.AvailableAt), Deadline: usOrZero(r.Deadline), ClaimedAt: usOrZero(r.ClaimedAt),
		ClaimedBy: r.ClaimedBy, PublishedAt: usOrZero(r.PublishedAt), At: usOrZero(r.UpdatedAt)}
	if created {
		s.Kind, s.Owner, s.Payload, s.MaxAttempts, s.CreatedAt = r.Kind, r.Owner, r.Payload, r.MaxAttempts, usOrZero(r.CreatedAt)
	}
	return s
}

// errUnrecordable: the row's intent cannot take an annotation (it is
// acked, or not in the log), so the row is not moved.
var errUnrecordable = errors.New("outbox: the intent of the row is finished")

// annotatable reports whether an intent in state s may take an outbox
// step as an annotation. Queued is left out: a bus message waiting in the
// queue owns its schedule (details.nextRetryAt), which an annotation would
// reset; a row never moves while its message is queued.
func annotatable(s tracing.State) bool {
	return s != "" && s != tracing.Acked && s != tracing.Queued
}

// withStep returns the events that record step for row nonce: carrier with
// its last event (when it is nonce's) carrying details.outbox, else
// carrier plus an annotation in the intent's current state. It returns
// errUnrecordable when neither is possible.
func (o *Outbox) withStep(ctx context.Context, nonce string, st step, carrier []tracing.Event) ([]tracing.Event, error) {
	if n := len(carrier); n > 0 && carrier[n-1].Nonce == nonce {
		out := append([]tracing.Event(nil), carrier...)
		last := &out[n-1]
		extra := make(map[string]any, len(last.Details.Extra)+1)
		for k, v := range last.Details.Extra {
			extra[k] = v
		}
		extra["outbox"] = st
		last.Details.Extra = extra
		return out, nil
	}
	row, ok, err := o.log.Intent(ctx, nonce)
	if err != nil {
		return nil, fmt.Errorf("outbox step of %s: %w", nonce, err)
	}
	// The carrier's own events come first.
	state := row.Status
	for _, ev := range carrier {
		if ev.Nonce == nonce {
			state = ev.State
		}
	}
	if !ok || !annotatable(state) {
		return nil, errUnrecordable
	}
	ev := tracing.Event{Nonce: nonce, State: state, Transport: directory.TransportFederation, Attempt: row.Attempt,
		Details: tracing.Details{Extra: map[string]any{"peer": st.Peer, "outbox": st}}}
	return append(append([]tracing.Event(nil), carrier...), ev), nil
}

// applyStep folds st, the next step of a row of nonce, into r.
func applyStep(r *Row, nonce string, st step) {
	if st.Kind != "" {
		r.EventID, r.Nonce, r.Kind, r.Owner, r.Payload = st.EventID, nonce, st.Kind, st.Owner, []byte(st.Payload)
		r.MaxAttempts = st.MaxAttempts
		r.CreatedAt = fromUs(st.CreatedAt)
	}
	r.Peer, r.State, r.Attempts, r.LastError = st.Peer, st.State, st.Attempts, st.LastError
	r.AvailableAt, r.Deadline, r.ClaimedAt = fromUs(st.AvailableAt), fromUs(st.Deadline), fromUs(st.ClaimedAt)
	r.ClaimedBy, r.PublishedAt, r.UpdatedAt = st.ClaimedBy, fromUs(st.PublishedAt), fromUs(st.At)
}

// RebuildOutbox refolds every row of federation_outbox that the log
// recorded from its steps, in log order, and writes the result (a row
// keeps its id; a missing row is inserted; a CLAIMED row loses its claim
// token, so only a reap moves it on). Rows written before outbox steps
// were logged are left as they are. `beam replay` calls it after the
// log's own projections are rebuilt; it returns the number of rows.
func RebuildOutbox(ctx context.Context, log *tracing.Log) (int, error) {
	var tables int
	if err := log.ReadDB().QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'federation_outbox'`).Scan(&tables); err != nil {
		return 0, fmt.Errorf("rebuild outbox: %w", err)
	}
	if tables == 0 {
		return 0, nil // this directory never federated
	}
	byID := map[string]*Row{}
	var order []string
	err := log.EachDetails(ctx, 0, func(nonce string, details []byte) error {
		if !bytes.Contains(details, []byte(`"outbox":{`)) {
			return nil // the cheap test first: most events carry no step
		}
		var d struct {
			Outbox *step `json:"outbox"`
		}
		if json.Unmarshal(details, &d) != nil || d.Outbox == nil || d.Outbox.EventID == "" {
			return nil
		}
		r := byID[d.Outbox.EventID]
		if r == nil {
			if d.Outbox.Kind == "" {
				return nil // a step of a row whose creation is not in the log
			}
			r = &Row{}
			byID[d.Outbox.EventID] = r
			order = append(order, d.Outbox.EventID)
		}
		applyStep(r, nonce, *d.Outbox)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("rebuild outbox: %w", err)
	}
	if _, err := log.Do(ctx, func(tx *sqlx.Tx) error {
		for _, id := range order {
			if err := upsertRow(tx, *byID[id]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("rebuild outbox: %w", unwrapFn(err))
	}
	return len(order), nil
}

// upsertRow writes r by event id.
func upsertRow(tx *sqlx.Tx, r Row) error {
	_, err := tx.Exec(`INSERT INTO federation_outbox(event_id, kind, peer, nonce, owner, payload, status, attempts,
  max_attempts, available_at, deadline, claimed_at, claimed_by, claim_token, published_at, last_error, created_at, updated_at)
VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,NULL,?,?,?,?)
ON CONFLICT(event_id) DO UPDATE SET kind = excluded.kind, peer = excluded.peer, nonce = excluded.nonce,
  owner = excluded.owner, payload = excluded.payload, status = excluded.status, attempts = excluded.attempts,
  max_attempts = excluded.max_attempts, available_at = excluded.available_at, deadline = excluded.deadline,
  claimed_at = excluded.claimed_at, claimed_by = excluded.claimed_by, claim_token = NULL,
  published_at = excluded.published_at, last_error = excluded.last_error, created_at = excluded.created_at,
  updated_at = excluded.updated_at`,
		r.EventID, r.Kind, r.Peer, r.Nonce, r.Owner, r.Payload, string(r.State), r.Attempts, r.MaxAttempts,
		us(r.AvailableAt), nullUs(r.Deadline), nullUs(r.ClaimedAt), nullStr(r.ClaimedBy), nullUs(r.PublishedAt),
		r.LastError, us(r.CreatedAt), us(r.UpdatedAt))
	if err != nil {
		return fmt.Errorf("write outbox row %s: %w", r.EventID, err)
	}
	return nil
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// usOrZero is t in unix microseconds, 0 for the zero time.
func usOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// fromUs is the inverse of usOrZero (UTC).
func fromUs(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMicro(v).UTC()
}
