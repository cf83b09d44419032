package directory

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// handleSend serves POST /intents/send: the body is an intent frame; a
// 200 body is the bare result frame (success, or the recipient's failure);
// every relay failure is a non-2xx {"error", "errorCode"} body.
func (d *Directory) handleSend(w http.ResponseWriter, r *http.Request) {
	if err := d.send(w, r); err != nil { // the adapter, without a closure per request
		d.api().WriteErr(w, r, err)
	}
}

// send is handleSend's handler: it returns its failure.
func (d *Directory) send(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(d.cfg.MaxBodyBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			d.m.rejected.WithLabelValues(codePayloadTooLarge).Inc()
			return httpjson.New(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "Request body exceeds the limit").
				With("limit", d.cfg.MaxBodyBytes)
		}
		return httpjson.BadRequest("INVALID_BODY", "Could not read the request body")
	}
	if token, ok := sendJWSToken(r, body); ok {
		return d.handleSendJWS(w, r, token)
	}
	if !json.Valid(body) {
		d.m.rejected.WithLabelValues(codeInvalidJSON).Inc()
		return httpjson.BadRequest(codeInvalidJSON, "Request body must be valid JSON")
	}
	f, err := wire.DecodeIntentFrame(body)
	if err != nil {
		rerr := relayErr(CodeInvalidIntent, peekNonce(body), "Invalid intent frame: %s", frameErrMsg(err))
		d.rejectFrame(rerr, "", originHTTP)
		return rerr.httpErr()
	}
	res, rerr := d.Relay(r.Context(), f, RelayOptions{Origin: originHTTP})
	if rerr != nil {
		return rerr.httpErr()
	}
	writeRaw(w, http.StatusOK, res)
	return nil
}
