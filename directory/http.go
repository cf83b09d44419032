package directory

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/beamdir/beam/agents/wire"
)

// handleSend serves POST /intents/send: the body is an intent frame; a
// 200 body is the bare result frame (success, or the recipient's failure);
// every relay failure is a non-2xx {"error", "errorCode"} body.
func (d *Directory) handleSend(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(d.cfg.MaxBodyBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			d.m.rejected.WithLabelValues(CodePayloadTooLarge).Inc()
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{
				"error": "Request body exceeds the limit", "errorCode": CodePayloadTooLarge, "limit": d.cfg.MaxBodyBytes})
			return
		}
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "Could not read the request body", "errorCode": "INVALID_BODY"})
		return
	}
	if token, ok := sendJWSToken(r, body); ok {
		d.handleSendJWS(w, r, token)
		return
	}
	if !json.Valid(body) {
		d.m.rejected.WithLabelValues(CodeInvalidJSON).Inc()
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "Request body must be valid JSON", "errorCode": CodeInvalidJSON})
		return
	}
	f, err := wire.DecodeIntentFrame(body)
	if err != nil {
		rerr := relayErr(CodeInvalidIntent, peekNonce(body), "Invalid intent frame: %s", frameErrMsg(err))
		d.rejectFrame(rerr, "", OriginHTTP)
		writeJSON(w, http.StatusBadRequest, rerr.httpBody())
		return
	}
	res, rerr := d.Relay(r.Context(), f, RelayOptions{Origin: OriginHTTP})
	if rerr != nil {
		writeRelayError(w, rerr)
		return
	}
	writeRaw(w, http.StatusOK, res)
}
