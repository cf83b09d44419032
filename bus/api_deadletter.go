package bus

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

func (b *Bus) handleDeadLetters(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	q := tracing.MessageQuery{Status: tracing.DeadLetter, Order: tracing.RecentlyFailedFirst,
		Limit: intParam(r, "limit", defaultDeadLimit, maxListLimit)}
	if aerr := filters(r, &q); aerr != nil {
		return aerr
	}
	b.scope(p, &q)
	return b.writeMessages(w, r, "dead letters", q)
}

func (b *Bus) handleRequeue(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	p, aerr := b.authenticate(r)
	if aerr != nil {
		return aerr
	}
	if !p.trusted {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "requeue needs the bus key or the operator token")
	}
	id := r.PathValue("id")
	err := b.Requeue(r.Context(), id)
	var se *stateError
	switch {
	case errors.Is(err, errNotFound):
		return httpjson.Errorf(http.StatusNotFound, codeMessageNotFound, "message %s not found", truncate(id))
	case errors.As(err, &se):
		return httpjson.Errorf(http.StatusConflict, codeInvalidState, "message %s is %s; only dead_letter or failed messages can be requeued", id, se.Status)
	case err != nil:
		return b.internal("requeue", err)
	}
	nonce, _, err := b.nonceOfID(r.Context(), id)
	if err != nil {
		return b.internal("requeue", err)
	}
	b.waitSettled(r.Context(), nonce)
	row, ok, err := b.message(r.Context(), nonce)
	if err != nil || !ok {
		return b.internal("requeue", fmt.Errorf("read back %s: %v", id, err))
	}
	body := b.sendResponse(r.Context(), row, false)
	body["requeued"] = true
	httpjson.Write(w, http.StatusOK, body)
	return nil
}
