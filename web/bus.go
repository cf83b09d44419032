package web

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// deadLetterSummary is one message row (tracing.MessageRow) as lists show it.
type deadLetterSummary struct {
	ID          string        `json:"id"`
	Nonce       string        `json:"nonce"`
	Sender      string        `json:"sender"`
	Recipient   string        `json:"recipient"`
	Intent      string        `json:"intent"`
	Status      tracing.State `json:"status"`
	Priority    int           `json:"priority"`
	RetryCount  int           `json:"retryCount"`
	MaxRetries  int           `json:"maxRetries"`
	Error       string        `json:"error,omitempty"`
	CreatedAt   *string       `json:"createdAt"`
	FailedAt    *string       `json:"failedAt"`
	UpdatedAt   *string       `json:"updatedAt"`
	NextRetryAt *string       `json:"nextRetryAt,omitempty"`
	TraceID     string        `json:"traceId,omitempty"`
	LastSeq     int64         `json:"lastSeq"`
}

func summaryOf(m *tracing.MessageRow) deadLetterSummary {
	created, updated := m.CreatedAt, m.UpdatedAt
	return deadLetterSummary{
		ID: m.ID, Nonce: m.Nonce, Sender: m.Sender, Recipient: m.Recipient, Intent: m.Intent,
		Status: m.Status, Priority: m.Priority, RetryCount: m.RetryCount, MaxRetries: m.MaxRetries,
		Error: m.Error, CreatedAt: isoSeconds(&created), FailedAt: isoSeconds(m.FailedAt),
		UpdatedAt: isoSeconds(&updated), NextRetryAt: isoSeconds(m.NextRetryAt), TraceID: m.TraceID, LastSeq: m.LastSeq,
	}
}

// requeueState tells the UI whether the requeue action can run and why not.
type requeueState struct {
	Available bool   `json:"available"`
	Allowed   bool   `json:"allowed"`
	Reason    string `json:"reason,omitempty"`
}

func (d *Dashboard) requeueFor(p principal) requeueState {
	switch {
	case d.cfg.Requeue == nil:
		return requeueState{Reason: "Requeue needs the message bus, which is not running in this directory."}
	case p.role != roleAdmin:
		return requeueState{Available: true, Reason: "Only operators (admin role) can requeue; you are signed in as a viewer."}
	}
	return requeueState{Available: true, Allowed: true}
}

type deadLettersResponse struct {
	DeadLetters []deadLetterSummary `json:"deadLetters"`
	Total       int64               `json:"total"`
	Limit       int                 `json:"limit"`
	Offset      int                 `json:"offset"`
	Requeue     requeueState        `json:"requeue"`
	Summary     struct {
		UniqueSenders    int64 `json:"uniqueSenders"`
		UniqueRecipients int64 `json:"uniqueRecipients"`
		MaxRetryCount    int64 `json:"maxRetryCount"`
	} `json:"summary"`
}

func (d *Dashboard) handleDeadLetters(w http.ResponseWriter, r *http.Request, p principal) error {
	q := r.URL.Query()
	limit, err := intParam(q, "limit", defaultListLimit, 1, maxListLimit)
	if err == nil {
		var offset int
		offset, err = intParam(q, "offset", 0, 0, maxOffset)
		if err == nil {
			return d.listDeadLetters(w, r, p, limit, offset)
		}
	}
	return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
}

func (d *Dashboard) listDeadLetters(w http.ResponseWriter, r *http.Request, p principal, limit, offset int) error {
	ctx := r.Context()
	resp := deadLettersResponse{DeadLetters: []deadLetterSummary{}, Limit: limit, Offset: offset, Requeue: d.requeueFor(p)}
	q := tracing.MessageQuery{Status: tracing.DeadLetter, Order: tracing.RecentlyFailedFirst, Limit: limit, Offset: offset}
	sum, err := d.log.SummarizeMessages(ctx, q)
	if err != nil {
		return httpjson.Internal("list dead letters failed", err)
	}
	resp.Total, resp.Summary.UniqueSenders, resp.Summary.UniqueRecipients = sum.Total, sum.Senders, sum.Recipients
	resp.Summary.MaxRetryCount = sum.MaxRetryCount
	rows, err := d.log.Messages(ctx, q)
	if err != nil {
		return httpjson.Internal("list dead letters failed", err)
	}
	for i := range rows {
		resp.DeadLetters = append(resp.DeadLetters, summaryOf(&rows[i]))
	}
	httpjson.Write(w, http.StatusOK, resp)
	return nil
}

type deadLetterDetail struct {
	Message  deadLetterSummary `json:"message"`
	Payload  json.RawMessage   `json:"payload"`
	Metadata json.RawMessage   `json:"metadata,omitempty"`
	Response json.RawMessage   `json:"response,omitempty"`
	Intent   *intentView       `json:"intent,omitempty"`
	Requeue  requeueState      `json:"requeue"`
}

func (d *Dashboard) message(ctx context.Context, id string) (tracing.MessageRow, bool, error) {
	return d.log.MessageByID(ctx, id)
}

func validJSON(b []byte) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return nil
	}
	return json.RawMessage(b)
}

func (d *Dashboard) handleDeadLetter(w http.ResponseWriter, r *http.Request, p principal) error {
	id := r.PathValue("id")
	if id == "" || len(id) > maxParamBytes {
		return httpjson.New(http.StatusBadRequest, "INVALID_ID", "the message id is empty or too long")
	}
	m, ok, err := d.message(r.Context(), id)
	if err != nil {
		return httpjson.Internal("read message failed", err)
	}
	if !ok {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no bus message with id "+id)
	}
	out := deadLetterDetail{
		Message: summaryOf(&m), Payload: validJSON(m.Payload), Metadata: validJSON(m.Metadata),
		Response: validJSON(m.Response), Requeue: d.requeueFor(p),
	}
	if out.Payload == nil {
		out.Payload = json.RawMessage("{}")
	}
	if row, ok, err := d.log.Intent(r.Context(), m.Nonce); err != nil {
		return httpjson.Internal("read message failed", err)
	} else if ok {
		v := viewOf(&row, false)
		out.Intent = &v
	}
	httpjson.Write(w, http.StatusOK, out)
	return nil
}

func (d *Dashboard) handleRequeue(w http.ResponseWriter, r *http.Request, p principal) error {
	id := r.PathValue("id")
	if id == "" || len(id) > maxParamBytes {
		return httpjson.New(http.StatusBadRequest, "INVALID_ID", "the message id is empty or too long")
	}
	if d.cfg.Requeue == nil {
		return httpjson.New(http.StatusNotImplemented, "REQUEUE_UNAVAILABLE", "requeue needs the message bus, which is not running in this directory")
	}
	m, ok, err := d.message(r.Context(), id)
	if err != nil {
		return httpjson.Internal("requeue failed", err)
	}
	if !ok {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no bus message with id "+id)
	}
	if m.Status != tracing.DeadLetter {
		return httpjson.New(http.StatusConflict, "NOT_DEAD_LETTER", "message "+id+" is "+string(m.Status)+", not dead_letter")
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if err := d.cfg.Requeue(ctx, id); err != nil {
		d.lg.Warn("dashboard: requeue", "id", id, "err", err)
		return httpjson.New(http.StatusBadGateway, "REQUEUE_FAILED", "requeue failed: "+err.Error())
	}
	d.lg.Info("dashboard: requeued dead letter", "id", id, "nonce", m.Nonce, "role", p.role)
	after, _, err := d.message(r.Context(), id)
	if err != nil {
		return httpjson.Internal("requeue failed", err)
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"requeued": true, "id": id, "nonce": m.Nonce, "status": after.Status})
	return nil
}
