package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// SendError is a send SendAs refused: the HTTP status, the error code and
// the message a bus API-key send would have been answered with.
type SendError struct {
	Status int
	Code   string
	Msg    string
}

func (e *SendError) Error() string { return e.Msg }

// SendAs sends a durable message from an agent another protocol (A2A)
// authenticated by its API key: exactly a POST /v1/beam/send made with that
// key, so the same rate limit, route and policy checks apply and the
// recipient gets the frame attested by the directory ("api_key"). It
// returns the message's nonce.
func (b *Bus) SendAs(ctx context.Context, from, to, intent string, payload json.RawMessage) (string, error) {
	if objectOrNil(payload) == nil || !json.Valid(payload) {
		return "", &SendError{Status: http.StatusBadRequest, Code: codeInvalidPayload, Msg: "payload must be a JSON object"}
	}
	if intent == "" || len(intent) > maxFieldBytes {
		return "", &SendError{Status: http.StatusBadRequest, Code: codeMissingFields, Msg: fmt.Sprintf("intent must be 1-%d bytes", maxFieldBytes)}
	}
	req := &sendRequest{from: from, to: to, intent: intent, payload: payload, nonce: wire.NewNonce(), auth: directory.BusAuthAPIKey}
	if aerr := b.checkSendRoute(req); aerr != nil {
		return "", sendError(aerr)
	}
	if aerr := b.checkDeliverySize(req); aerr != nil {
		return "", sendError(aerr)
	}
	if b.cfg.AllowSender != nil {
		if ok, _ := b.cfg.AllowSender(from); !ok {
			return "", &SendError{Status: http.StatusTooManyRequests, Code: codeRateLimited, Msg: "too many sends from " + from + "; retry later"}
		}
	}
	if _, _, aerr := b.accept(ctx, req); aerr != nil {
		return "", sendError(aerr)
	}
	return req.nonce, nil
}

func sendError(e *httpjson.Error) *SendError {
	return &SendError{Status: e.Status, Code: e.Code, Msg: e.Message}
}

// Message returns the message of nonce, as GET /v1/beam/messages shows it.
func (b *Bus) Message(ctx context.Context, nonce string) (tracing.MessageRow, bool, error) {
	return b.message(ctx, nonce)
}

// awaitPoll is how often Await reads the message again.
const awaitPoll = 50 * time.Millisecond

// Await reads the message of nonce until it has its outcome (acked,
// failed or dead-lettered) or max has passed, and returns it as it then
// stands; it reads the log again every 50 ms.
func (b *Bus) Await(ctx context.Context, nonce string, max time.Duration) (tracing.MessageRow, error) {
	deadline := time.Now().Add(max)
	tick := time.NewTicker(awaitPoll)
	defer tick.Stop()
	for {
		row, ok, err := b.message(ctx, nonce)
		if err != nil {
			return row, err
		}
		if ok && (row.Status.Terminal() || !time.Now().Before(deadline)) {
			return row, nil
		}
		select {
		case <-ctx.Done():
			return row, ctx.Err()
		case <-tick.C:
		}
	}
}
