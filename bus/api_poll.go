package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

func (b *Bus) handlePoll(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	agent := strings.TrimSpace(r.URL.Query().Get("agent"))
	if agent == "" {
		return httpjson.Errorf(http.StatusBadRequest, codeMissingAgent, "the agent query parameter is required")
	}
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	if !p.canActAs(agent) {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "%s may not poll the inbox of %s", p.agent, truncate(agent))
	}
	if _, ok := b.reg.Get(agent); !ok {
		return httpjson.Errorf(http.StatusNotFound, codeUnknownAgent, "agent %s is not registered here", truncate(agent))
	}
	limit := intParam(r, "limit", defaultPollLimit, maxPollLimit)
	q := r.URL.Query()
	if c := q.Get("claim"); c == "true" || c == "1" {
		lease := b.cfg.DefaultLease
		if s := q.Get("lease"); s != "" {
			if lease, aerr = b.leaseDuration(strconv.ParseFloat(s, 64)); aerr != nil {
				return aerr
			}
		}
		rows, err := b.claimLeases(r.Context(), agent, limit, lease)
		if err != nil && len(rows) == 0 {
			return b.internal("poll claim", err)
		}
		msgs := messageViews(rows, true)
		body := map[string]any{"messages": msgs, "count": len(msgs)}
		if len(rows) > 0 {
			body["lease_id"] = rows[0].LeaseOwner
			body["lease_expires_at"] = rows[0].LeaseExpiresAt
		}
		httpjson.Write(w, http.StatusOK, body)
		return nil
	}
	status, aerr := statusParam(r, string(tracing.Delivered))
	if aerr != nil {
		return aerr
	}
	since, aerr := floatParam(r, "since")
	if aerr != nil {
		return aerr
	}
	return b.writeMessages(w, r, "poll", tracing.MessageQuery{Recipient: agent, Status: tracing.State(status),
		CreatedAfter: since, CreatedSince: new(b.registeredSince(agent)), Order: tracing.OldestFirst, Limit: limit})
}

// lookup finds a message by message_id or nonce from a JSON body.
func (b *Bus) lookup(ctx context.Context, raw map[string]json.RawMessage) (string, *httpjson.Error) {
	id, aerr := str(raw, "message_id")
	if aerr != nil {
		return "", aerr
	}
	nonce, aerr := str(raw, "nonce")
	if aerr != nil {
		return "", aerr
	}
	if id == "" && nonce == "" {
		return "", httpjson.Errorf(http.StatusBadRequest, codeMissingMessageID, "message_id or nonce is required")
	}
	if id != "" {
		n, ok, err := b.nonceOfID(ctx, id)
		if err != nil {
			return "", httpjson.Errorf(http.StatusInternalServerError, codeInternal, "look up failed")
		}
		if !ok {
			return "", httpjson.Errorf(http.StatusNotFound, codeMessageNotFound, "message %s not found", id)
		}
		if nonce != "" && nonce != n {
			return "", httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "message_id and nonce name different messages")
		}
		return n, nil
	}
	return nonce, nil
}

func (b *Bus) handleAck(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	raw, p, aerr := b.authedBody(w, r)
	if aerr != nil {
		return aerr
	}
	status, aerr := str(raw, "status")
	if aerr != nil {
		return aerr
	}
	if status == "" {
		status = string(tracing.Acked)
	}
	if status != string(tracing.Acked) && status != string(tracing.Failed) {
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidStatus, "status must be acked or failed")
	}
	var response json.RawMessage
	if rv, ok := raw["response"]; ok && string(rv) != "null" {
		if objectOrNil(rv) == nil {
			return httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "response must be a JSON object")
		}
		response = rv
	}
	leaseID, aerr := str(raw, "lease_id")
	if aerr != nil {
		return aerr
	}
	nonce, aerr := b.lookup(r.Context(), raw)
	if aerr != nil {
		return aerr
	}
	row, aerr := b.ack(r.Context(), p, nonce, tracing.State(status), response, leaseID)
	if aerr != nil {
		return aerr
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"message_id": row.ID, "id": row.ID, "nonce": row.Nonce, "status": row.Status, "updated_at": row.UpdatedAt})
	return nil
}

// ack records a consumer's completion: delivered → acked|failed, or for a
// message dispatched under a live poll lease held by leaseID, dispatched →
// delivered → acked|failed.
func (b *Bus) ack(ctx context.Context, p principal, nonce string, status tracing.State, response json.RawMessage, leaseID string) (tracing.MessageRow, *httpjson.Error) {
	unlock := b.keys.Lock(nonce)
	c, aerr := b.recipientCurrent(ctx, p, nonce, "ack")
	row, n := c.MessageRow, c.Attempt
	if aerr != nil {
		unlock()
		return row, aerr
	}
	now := b.clock()
	var pre []tracing.Event
	transport := transportBus
	switch row.Status {
	case tracing.Delivered:
	case tracing.Dispatched:
		e := httpjson.Errorf(http.StatusConflict, codeInvalidState, "message %s is dispatched under a poll lease that %s", row.ID, "is not yours")
		switch {
		case row.LeaseOwner == "":
			e.Message = fmt.Sprintf("message %s is being delivered over WebSocket; ack it once delivered", row.ID)
			e.With("reason", reasonWebSocketInFlux)
		case leaseID != row.LeaseOwner:
			e.With("reason", reasonLeaseMismatch)
		case row.LeaseExpiresAt == nil || *row.LeaseExpiresAt <= secs(now):
			e.Message = fmt.Sprintf("the lease on message %s has expired", row.ID)
			e.With("reason", reasonLeaseExpired)
		default:
			e = nil
		}
		if e != nil {
			unlock()
			return row, e
		}
		transport = transportPoll
		pre = append(pre, event(row, tracing.Delivered, transportPoll, n))
	default:
		unlock()
		e := httpjson.Errorf(http.StatusConflict, codeInvalidState, "Invalid message %s lifecycle transition from %s to %s", row.ID, row.Status, status)
		if row.Status == tracing.Queued && leaseID != "" {
			e.With("reason", reasonLeaseExpired)
		}
		return row, e
	}
	lat := latencyMs(row, now)
	ev := event(row, status, transport, n)
	var result []byte
	if status == tracing.Acked {
		result = successResult(row.Nonce, response, now, lat)
		ev.Details = tracing.Details{Response: response, Result: result, LatencyMs: lat, Extra: map[string]any{"ackedBy": ackedBy(p)}}
	} else {
		msg := "Manually failed"
		if len(response) > 0 {
			msg = string(response)
		}
		result = wire.FailureResult(row.Nonce, codeConsumerFailed, msg, now, lat)
		ev.Details = tracing.Details{ErrorCode: codeConsumerFailed, Error: msg, Response: response, Result: result,
			LatencyMs: lat, Extra: map[string]any{"ackedBy": ackedBy(p)}}
	}
	err := b.append(append(pre, ev)...)
	if err == nil {
		row, _, err = b.message(ctx, nonce)
	}
	unlock()
	if err != nil {
		var te *tracing.TransitionError
		if errors.As(err, &te) {
			return row, httpjson.Errorf(http.StatusConflict, codeInvalidState, "message %s changed state meanwhile", row.ID)
		}
		if e := notReplicated(err); e != nil {
			b.lg.Warn("bus: record ack", "nonce", nonce, "err", err)
			return row, e
		}
		b.lg.Error("bus: record ack", "nonce", nonce, "err", err)
		return row, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "ack could not be recorded")
	}
	b.forget(nonce)
	b.m.outcomes.WithLabelValues(string(status)).Inc()
	b.notifySender(row, status, result)
	return row, nil
}

// recipientCurrent reads nonce's message for a change only its recipient may
// make (action, as in "only the recipient … may <action> message …"): a
// failed read is a 500, an unknown nonce a 404 and a principal that cannot
// act as the recipient a 403. The caller holds the nonce's lock.
func (b *Bus) recipientCurrent(ctx context.Context, p principal, nonce, action string) (current, *httpjson.Error) {
	c, ok, err := b.current(ctx, nonce)
	if err != nil {
		return c, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "look up failed")
	}
	if !ok {
		return c, httpjson.Errorf(http.StatusNotFound, codeMessageNotFound, "message %s not found", truncate(nonce))
	}
	if !p.canActAs(c.Recipient) {
		return c, httpjson.Errorf(http.StatusForbidden, codeForbidden, "only the recipient %s may %s message %s", c.Recipient, action, c.ID)
	}
	return c, nil
}

func ackedBy(p principal) string {
	if p.agent != "" {
		return p.agent
	}
	return p.via
}

func (b *Bus) handleLease(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	raw, p, aerr := b.authedBody(w, r)
	if aerr != nil {
		return aerr
	}
	leaseID, aerr := str(raw, "lease_id")
	if aerr != nil {
		return aerr
	}
	if leaseID == "" {
		return httpjson.Errorf(http.StatusBadRequest, codeMissingFields, "lease_id is required")
	}
	lease := b.cfg.DefaultLease
	if lv, ok := raw["lease"]; ok {
		var v float64
		err := json.Unmarshal(lv, &v)
		if lease, aerr = b.leaseDuration(v, err); aerr != nil {
			return aerr
		}
	}
	nonce, aerr := b.lookup(r.Context(), raw)
	if aerr != nil {
		return aerr
	}
	row, aerr := b.renew(r.Context(), p, nonce, leaseID, lease)
	if aerr != nil {
		return aerr
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"message_id": row.ID, "id": row.ID, "nonce": row.Nonce, "lease_id": row.LeaseOwner,
		"lease_expires_at": row.LeaseExpiresAt})
	return nil
}

// renew extends a live poll lease held by leaseID to now + lease.
func (b *Bus) renew(ctx context.Context, p principal, nonce, leaseID string, lease time.Duration) (tracing.MessageRow, *httpjson.Error) {
	unlock := b.keys.Lock(nonce)
	defer unlock()
	c, aerr := b.recipientCurrent(ctx, p, nonce, "renew leases on")
	row, n := c.MessageRow, c.Attempt
	if aerr != nil {
		return row, aerr
	}
	now := b.clock()
	if row.Status != tracing.Dispatched || row.LeaseOwner != leaseID || row.LeaseExpiresAt == nil || *row.LeaseExpiresAt <= secs(now) {
		e := httpjson.Errorf(http.StatusConflict, codeInvalidState, "message %s is not under a live lease %s", row.ID, truncate(leaseID))
		e.With("reason", reasonLeaseExpired)
		return row, e
	}
	ev := event(row, tracing.Dispatched, transportPoll, n)
	ev.Details = tracing.Details{LeaseOwner: leaseID, LeaseExpiresAt: now.Add(lease).UnixMilli(), TimeoutMs: lease.Milliseconds(),
		Extra: map[string]any{"leaseRenewed": true}}
	if err := b.append(ev); err != nil {
		b.lg.Error("bus: renew lease", "nonce", nonce, "err", err)
		return row, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "lease could not be renewed")
	}
	row, _, err := b.message(ctx, nonce)
	if err != nil {
		return row, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "look up failed")
	}
	return row, nil
}

// leaseDuration turns a requested lease of v seconds, parsed with err, into
// a duration; a parse error or a value outside (0, MaxLease] is a 400.
func (b *Bus) leaseDuration(v float64, err error) (time.Duration, *httpjson.Error) {
	if err != nil || v <= 0 || math.IsNaN(v) || v > b.cfg.MaxLease.Seconds() {
		return 0, httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "lease must be seconds in (0, %g]", b.cfg.MaxLease.Seconds())
	}
	return time.Duration(v * float64(time.Second)), nil
}
