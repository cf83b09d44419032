package bus

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// sendRequest is a validated POST /v1/beam/send.
type sendRequest struct {
	from, to, intent string
	payload          json.RawMessage
	nonce            string
	priority         int
	traceID          string
	frame            *wire.IntentFrame // the sender's signed frame (signature auth)
	auth             string            // directory.BusAuth*
}

func (b *Bus) handleSend(w http.ResponseWriter, r *http.Request) *httpjson.Error {
	raw, aerr := b.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	req, aerr := b.parseSend(r, raw)
	if aerr != nil {
		return aerr
	}
	if b.cfg.AllowSender != nil {
		if ok, wait := b.cfg.AllowSender(req.from); !ok {
			aerr := httpjson.Errorf(http.StatusTooManyRequests, codeRateLimited, "too many sends from %s; retry later", req.from)
			aerr.RetryAfter = wait
			return aerr
		}
	}
	status, body, aerr := b.accept(r.Context(), req)
	if aerr != nil {
		return aerr
	}
	httpjson.Write(w, status, body)
	return nil
}

// parseSend authenticates and validates a send body: {from|sender, to,
// intent, payload?, nonce?, priority?, trace_id?}, or {frame: signed beam/1
// frame | beam/2 JWS string, priority?, trace_id?}, or a signed beam/1
// frame as the whole body.
func (b *Bus) parseSend(r *http.Request, raw map[string]json.RawMessage) (*sendRequest, *httpjson.Error) {
	req := &sendRequest{}
	f, aerr := b.sendFrame(raw)
	if aerr != nil {
		return nil, aerr
	}
	req.frame = f
	var p principal
	if req.frame == nil {
		if p, aerr = b.authenticate(r); aerr != nil {
			return nil, aerr
		}
	}
	if aerr := sendOptions(raw, req); aerr != nil {
		return nil, aerr
	}
	if f := req.frame; f != nil {
		fieldsFromFrame(req, f)
	} else if aerr := fieldsFromBody(raw, req, p); aerr != nil {
		return nil, aerr
	}
	if len(req.payload) == 0 {
		req.payload = json.RawMessage("{}")
	}
	if req.nonce == "" {
		req.nonce = wire.NewNonce()
	}
	if aerr := b.checkSendRoute(req); aerr != nil {
		return nil, aerr
	}
	if aerr := b.checkDeliverySize(req); aerr != nil {
		return nil, aerr
	}
	return req, nil
}

// sendFrame is the sender-signed frame of a send, verified: the frame
// member, or the whole body when it is itself a signed beam/1 frame; nil
// when the send carries none.
func (b *Bus) sendFrame(raw map[string]json.RawMessage) (*wire.IntentFrame, *httpjson.Error) {
	var frameRaw json.RawMessage
	if fr, ok := raw["frame"]; ok && string(fr) != "null" {
		frameRaw = fr
	} else if _, signed := raw["signature"]; signed {
		if _, ok := raw["timestamp"]; ok {
			whole, _ := json.Marshal(raw)
			frameRaw = whole
		}
	}
	if frameRaw == nil {
		return nil, nil
	}
	return b.verifyFrame(frameRaw)
}

// sendOptions reads trace_id and priority.
func sendOptions(raw map[string]json.RawMessage, req *sendRequest) *httpjson.Error {
	var aerr *httpjson.Error
	if req.traceID, aerr = str(raw, "trace_id"); aerr != nil {
		return aerr
	}
	if pr, ok := raw["priority"]; ok && string(pr) != "null" {
		var v float64
		if err := json.Unmarshal(pr, &v); err != nil || math.IsNaN(v) || math.Abs(v) > 1e6 {
			return httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "priority must be a number between -1e6 and 1e6")
		}
		req.priority = int(v)
	}
	return nil
}

// fieldsFromFrame takes sender, recipient, intent, nonce and payload from a
// verified frame.
func fieldsFromFrame(req *sendRequest, f *wire.IntentFrame) {
	req.from, req.to, req.intent, req.nonce = f.From, f.To, f.Intent, f.Nonce
	req.payload = json.RawMessage(f.Payload)
	if f.Signature != "" {
		req.auth = directory.BusAuthSignature
	} else {
		req.auth = directory.BusAuthJWS
	}
}

// fieldsFromBody takes them from the body of an unsigned send, which the
// principal p must be allowed to make as its sender.
func fieldsFromBody(raw map[string]json.RawMessage, req *sendRequest, p principal) *httpjson.Error {
	var aerr *httpjson.Error
	if req.from, aerr = str(raw, "from"); aerr != nil {
		return aerr
	}
	if req.from == "" {
		if req.from, aerr = str(raw, "sender"); aerr != nil {
			return aerr
		}
	}
	if req.to, aerr = str(raw, "to"); aerr != nil {
		return aerr
	}
	if req.intent, aerr = str(raw, "intent"); aerr != nil {
		return aerr
	}
	if req.from == "" || req.to == "" || req.intent == "" {
		return httpjson.Errorf(http.StatusBadRequest, codeMissingFields, "from, to and intent are required")
	}
	if req.nonce, aerr = str(raw, "nonce"); aerr != nil {
		return aerr
	}
	if pl, ok := raw["payload"]; ok && string(pl) != "null" {
		if objectOrNil(pl) == nil || !json.Valid(pl) {
			return httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "payload must be a JSON object")
		}
		req.payload = pl
	}
	if !p.canActAs(req.from) {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "the API key of %s may not send as %s", p.agent, req.from)
	}
	req.auth = p.via
	if p.via == "operator" {
		req.auth = directory.BusAuthBusKey
	}
	return nil
}

// checkSendRoute checks that the sender is a local agent and that the
// recipient is a local agent the sender may reach, or a peer's agent.
func (b *Bus) checkSendRoute(req *sendRequest) *httpjson.Error {
	if _, ok := b.reg.Get(req.from); !ok {
		return httpjson.Errorf(http.StatusNotFound, codeUnknownAgent, "sender %s is not registered here", req.from)
	}
	if !b.reg.Serves(req.from) {
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "sender %s is in a domain this directory does not serve", req.from)
	}
	_, local := b.reg.Get(req.to)
	local = local && b.reg.Serves(req.to)
	if !local {
		peer := b.remotePeer(req.to)
		if peer == "" {
			return b.unknownRecipient(req.to)
		}
		// The peer applies its own policies (and its agent's
		// requireSenderSignatures setting) to its agent (remote.go).
		return nil
	}
	if ok, reason := b.reg.Allowed(req.from, req.to, req.intent); !ok {
		msg := fmt.Sprintf("ACL denied intent %s from %s to %s", req.intent, req.from, req.to)
		if reason != "" {
			msg += " (" + reason + ")"
		}
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "%s", msg)
	}
	return b.checkEndToEnd(req)
}

// checkDeliverySize refuses a send whose delivered frame would exceed what
// recipients accept. An unsigned frame is delivered attested, with a
// signature, so its size is measured signed.
func (b *Bus) checkDeliverySize(req *sendRequest) *httpjson.Error {
	probe := req.frame
	if probe == nil || req.auth != directory.BusAuthSignature {
		probe = wire.NewIntentFrame(req.from, req.to, req.intent, req.payload, b.clock())
		probe.Nonce = req.nonce
	}
	size, err := probe.SignedDeliverySize()
	if err != nil {
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "payload cannot be delivered: %v", err)
	}
	if size > b.dir.MaxFrameBytes() {
		return httpjson.Errorf(http.StatusRequestEntityTooLarge, codePayloadTooLarge,
			"the delivered frame would be %d bytes; recipients accept at most %d", size, b.dir.MaxFrameBytes())
	}
	return nil
}

// verifyFrame checks a sender-signed frame: a beam/1 frame object whose
// signature verifies with the registered key and whose timestamp is within
// ±5 minutes, or a beam/2 JWS string.
func (b *Bus) verifyFrame(raw json.RawMessage) (*wire.IntentFrame, *httpjson.Error) {
	var tok string
	if json.Unmarshal(raw, &tok) == nil {
		f, err := wire.DecodeIntentJWS(tok, func(kid string) (ed25519.PublicKey, error) {
			a, ok := b.reg.Get(kid)
			if !ok {
				return nil, fmt.Errorf("unknown signer %s", kid)
			}
			return a.PublicKey, nil
		})
		if err != nil {
			var dup *wire.DuplicateKeyError
			var fe *wire.FrameError
			if errors.As(err, &dup) || errors.As(err, &fe) {
				// Signed, but not a frame every reader reads alike.
				return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "invalid frame: %v", err)
			}
			return nil, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "beam/2 frame does not verify: %v", err)
		}
		f.Signature = ""
		f.Raw = nil
		if aerr := checkFrameFields(f); aerr != nil {
			return nil, aerr
		}
		if aerr := b.checkFresh(f); aerr != nil {
			return nil, aerr
		}
		return f, nil
	}
	f, err := wire.DecodeIntentFrame(raw)
	if err != nil {
		return nil, httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "invalid frame: %v", err)
	}
	if aerr := checkFrameFields(f); aerr != nil {
		return nil, aerr
	}
	if f.Signature == "" {
		return nil, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "the frame carries no signature")
	}
	sender, ok := b.reg.Get(f.From)
	if !ok {
		return nil, httpjson.Errorf(http.StatusNotFound, codeUnknownAgent, "sender %s is not registered here", f.From)
	}
	if err := f.Verify(sender.PublicKey); err != nil {
		return nil, httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "signature verification failed")
	}
	if aerr := b.checkFresh(f); aerr != nil {
		return nil, aerr
	}
	return f, nil
}

// checkFresh applies the one freshness rule every entry path shares to a
// sender-signed frame (beam/1 or beam/2): its timestamp within ±5 minutes
// of now. The nonce rules apply later, when the message is recorded.
func (b *Bus) checkFresh(f *wire.IntentFrame) *httpjson.Error {
	ts, err := wire.ParseTimestamp(f.Timestamp)
	if err != nil {
		return httpjson.Errorf(http.StatusBadRequest, codeInvalidPayload, "invalid frame timestamp")
	}
	if d := b.clock().Sub(ts); d > signedFrameWindow || d < -signedFrameWindow {
		return httpjson.Errorf(http.StatusUnauthorized, codeUnauthorized, "signed frame timestamp is outside the 5 minute window")
	}
	return nil
}

func checkFrameFields(f *wire.IntentFrame) *httpjson.Error {
	for _, s := range []string{f.From, f.To, f.Intent, f.Nonce} {
		if s == "" || len(s) > maxFieldBytes {
			return httpjson.Errorf(http.StatusBadRequest, codeMissingFields, "frame from, to, intent and nonce must be 1-%d bytes", maxFieldBytes)
		}
	}
	return nil
}

// payloadHash is the hex SHA-256 of the JavaScript-normalised payload, the
// same hash the directory records, so either side detects a reused nonce.
func payloadHash(payload []byte) string {
	js, err := wire.JSStringify(payload)
	if err != nil {
		js = payload
	}
	sum := sha256.Sum256(js)
	return hex.EncodeToString(sum[:])
}

func newMessageID() string {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	return hex.EncodeToString(raw[:])
}

// dedupe answers a send whose nonce exists: the same message again is
// 200 deduped; anything else is 409 NONCE_REUSE_CONFLICT.
func (b *Bus) dedupe(ctx context.Context, ir tracing.IntentRow, req *sendRequest, hash string) (int, any, *httpjson.Error) {
	conflict := httpjson.Errorf(http.StatusConflict, codeNonceReuse, "nonce %s was already used for a different message", req.nonce)
	if ir.Owner != tracing.OwnerBus || ir.From != req.from || ir.To != req.to || ir.IntentType != req.intent {
		return 0, nil, conflict
	}
	first, err := b.firstDetails(ctx, req.nonce)
	if err != nil {
		return 0, nil, httpjson.Errorf(http.StatusInternalServerError, codeInternal, "look up nonce failed")
	}
	if h, _ := first.Extra["payloadHash"].(string); h != hash {
		return 0, nil, conflict
	}
	row, ok, err := b.message(ctx, req.nonce)
	if err != nil || !ok {
		return 0, nil, conflict
	}
	return http.StatusOK, b.sendResponse(ctx, row, true), nil
}

// sendResponse is the body of a send or requeue answer. The id is there
// twice: message_id as the reference names it here, id as poll, history
// and dead letters name it.
func (b *Bus) sendResponse(ctx context.Context, row tracing.MessageRow, deduped bool) map[string]any {
	out := map[string]any{
		"message_id": row.ID, "id": row.ID, "nonce": row.Nonce, "status": row.Status, "created_at": row.CreatedAt,
		"retry_count": row.RetryCount,
	}
	if deduped {
		out["deduped"] = true
	}
	if row.NextRetryAt != nil {
		out["next_retry_at"] = *row.NextRetryAt
	}
	switch row.Status {
	case tracing.Queued, tracing.DeadLetter, tracing.Failed:
		if row.Error != "" {
			out["error"] = row.Error
		}
		if row.Error == "" {
			// Every event that records an error code records an error.
			break
		}
		if ir, ok, err := b.log.Intent(ctx, row.Nonce); err == nil && ok && ir.ErrorCode != "" {
			out["error_code"] = ir.ErrorCode
		}
	}
	return out
}
