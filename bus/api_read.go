package bus

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// messageView is a message row (tracing.MessageRow) as the API shows it (epoch seconds,
// snake_case, JSON fields parsed): the wire type the Go SDK reads.
type messageView = wire.BusMessage

func rawOrNull(r tracing.RawJSON) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return json.RawMessage(r)
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func view(m tracing.MessageRow, withLease bool) messageView {
	v := messageView{
		ID: m.ID, MessageID: m.ID, Nonce: m.Nonce, Sender: m.Sender, Recipient: m.Recipient, Intent: m.Intent,
		Payload: rawOrNull(m.Payload), Status: string(m.Status), Priority: m.Priority, RetryCount: m.RetryCount,
		MaxRetries: m.MaxRetries, NextRetryAt: m.NextRetryAt, CreatedAt: m.CreatedAt, DeliveredAt: m.DeliveredAt,
		AckedAt: m.AckedAt, FailedAt: m.FailedAt, Error: strOrNil(m.Error), Response: rawOrNull(m.Response),
		TraceID: strOrNil(m.TraceID), Metadata: rawOrNull(m.Metadata), LeaseExpiresAt: m.LeaseExpiresAt,
		UpdatedAt: m.UpdatedAt,
	}
	if withLease {
		v.LeaseID = m.LeaseOwner
	}
	return v
}

// messageViews shows rows as the API does; withLease adds each row's lease
// id.
func messageViews(rows []tracing.MessageRow, withLease bool) []messageView {
	msgs := make([]messageView, 0, len(rows))
	for _, m := range rows {
		msgs = append(msgs, view(m, withLease))
	}
	return msgs
}

// writeMessages answers a list request with {"messages", "count"}: the
// messages q selects. what names the list when the query fails.
func (b *Bus) writeMessages(w http.ResponseWriter, r *http.Request, what string, q tracing.MessageQuery) *httpjson.Error {
	rows, err := b.log.Messages(r.Context(), q)
	if err != nil {
		return b.internal(what, err)
	}
	msgs := messageViews(rows, false)
	httpjson.Write(w, http.StatusOK, map[string]any{"messages": msgs, "count": len(msgs)})
	return nil
}

func (b *Bus) handleMessage(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	id := r.PathValue("id")
	nonce, ok, err := b.nonceOfID(r.Context(), id)
	if err != nil {
		return b.internal("message", err)
	}
	if !ok {
		nonce = id
	}
	row, ok, err := b.message(r.Context(), nonce)
	if err != nil {
		return b.internal("message", err)
	}
	if !ok {
		return httpjson.Errorf(http.StatusNotFound, codeMessageNotFound, "message %s not found", truncate(id))
	}
	if !p.canActAs(row.Sender) && !p.canActAs(row.Recipient) || !p.trusted && row.CreatedAt < b.registeredSince(p.agent) {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "message %s is neither from nor to %s", row.ID, p.agent)
	}
	httpjson.Write(w, http.StatusOK, view(row, p.canActAs(row.Recipient)))
	return nil
}

// scope restricts an agent principal to its own messages, created since
// its registration (registeredSince).
func (b *Bus) scope(p principal, q *tracing.MessageQuery) {
	if p.trusted {
		return
	}
	q.Party = p.agent
	if since := b.registeredSince(p.agent); q.CreatedSince == nil || *q.CreatedSince < since {
		q.CreatedSince = &since
	}
}

// filters reads the sender, recipient and intent filters of a list request.
func filters(r *http.Request, q *tracing.MessageQuery) *httpjson.Error {
	for _, f := range []struct {
		key string
		dst *string
	}{{"sender", &q.Sender}, {"recipient", &q.Recipient}, {"intent", &q.Intent}} {
		if v := r.URL.Query().Get(f.key); v != "" {
			if len(v) > maxFilterBytes {
				return httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "%s is too long", f.key)
			}
			*f.dst = v
		}
	}
	return nil
}

func (b *Bus) handleHistory(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	q := tracing.MessageQuery{Order: tracing.NewestFirst, Limit: intParam(r, "limit", defaultHistoryLimit, maxListLimit)}
	if aerr := filters(r, &q); aerr != nil {
		return aerr
	}
	status, aerr := statusParam(r, "")
	if aerr != nil {
		return aerr
	}
	q.Status = tracing.State(status)
	if q.CreatedSince, aerr = floatParam(r, "since"); aerr != nil {
		return aerr
	}
	if q.CreatedUntil, aerr = floatParam(r, "until"); aerr != nil {
		return aerr
	}
	b.scope(p, &q)
	return b.writeMessages(w, r, "history", q)
}

func (b *Bus) handleStats(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	ctx := r.Context()
	var q tracing.MessageQuery
	b.scope(p, &q)
	counts, err := b.log.MessageCountsByState(ctx, q)
	if err != nil {
		return b.internal("stats", err)
	}
	body := map[string]any{}
	var total int64
	for _, s := range tracing.States {
		body[string(s)] = counts[s]
		total += counts[s]
	}
	body["total"] = total
	byAgent := map[string]map[string]int64{}
	for _, side := range []struct {
		bySender bool
		key      string
	}{{true, "sent"}, {false, "received"}} {
		perAgent, err := b.log.MessageCountsByAgent(ctx, side.bySender, q, 1000)
		if err != nil {
			return b.internal("stats", err)
		}
		for id, n := range perAgent {
			if byAgent[id] == nil {
				byAgent[id] = map[string]int64{"sent": 0, "received": 0}
			}
			byAgent[id][side.key] = n
		}
	}
	body["by_agent"] = byAgent
	if since := secs(b.clock().Add(-24 * time.Hour)); q.CreatedSince == nil || *q.CreatedSince < since {
		q.CreatedSince = &since
	}
	day, err := b.log.SummarizeMessages(ctx, q)
	if err != nil {
		return b.internal("stats", err)
	}
	body["last_24h"] = day.Total
	httpjson.Write(w, http.StatusOK, body)
	return nil
}
