package directory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// echo answers an intent to echo@beam.directory with the built-in echo.
// Nothing leaves the process, so every event is written in one append.
func (d *Directory) echo(inf *inflight, f *wire.IntentFrame, pre []tracing.Event) {
	payload, err := echoPayload(f)
	if err != nil {
		d.fail(inf, pre, CodeInvalidIntent, fmt.Sprintf("echo: %v", err), false, nil)
		return
	}
	now := d.clock()
	lat := inf.latencyMs(now)
	res, err := wire.Result{Success: true, Nonce: inf.nonce, Payload: payload, Latency: lat}.Build(now, nil)
	if err != nil {
		d.fail(inf, pre, CodeRelayError, fmt.Sprintf("echo: %v", err), false, nil)
		return
	}
	disp := inf.event(tracing.Dispatched, transportEcho)
	disp.Details.TimeoutMs = inf.timeout.Milliseconds()
	ack := inf.event(tracing.Acked, transportEcho)
	ack.Details = tracing.Details{LatencyMs: lat, Result: res}
	events := append(pre, disp, inf.event(tracing.Delivered, transportEcho), ack)
	if err := d.append(events...); err != nil {
		d.abort(inf, err)
		return
	}
	d.release(inf)
	d.m.relayed.WithLabelValues(outcomeAcked).Inc()
	inf.done(res, nil)
}

// echoPayload builds the built-in echo's answer.
func echoPayload(f *wire.IntentFrame) ([]byte, error) {
	original := json.RawMessage(f.Payload)
	if len(original) == 0 {
		original = json.RawMessage("{}")
	}
	var v any
	if f.Intent == "conversation.message" {
		var p struct {
			Message any `json:"message"`
		}
		_ = json.Unmarshal(original, &p)
		text, ok := p.Message.(string)
		if !ok && p.Message != nil {
			b, _ := json.Marshal(p.Message)
			text = string(b)
		}
		v = struct {
			Message   string `json:"message"`
			From      string `json:"from"`
			HandledBy string `json:"handledBy"`
		}{"Echo: " + text, registry.EchoBeamID, "builtin-echo"}
	} else {
		v = struct {
			OK              bool            `json:"ok"`
			BeamID          string          `json:"beamId"`
			HandledBy       string          `json:"handledBy"`
			Transport       string          `json:"transport"`
			Intent          string          `json:"intent"`
			Message         string          `json:"message"`
			OriginalPayload json.RawMessage `json:"originalPayload"`
		}{true, registry.EchoBeamID, "builtin-echo", transportEcho, f.Intent,
			"Echo received " + f.Intent + " from " + f.From, original}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode echo payload: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// directHTTP delivers to the recipient's HTTP endpoint (§5.5). A failure
// there is noted in the details of the next event and the intent falls
// through to the recipient's WebSocket session. It runs in its own
// goroutine: the POST may take up to DirectHTTPTimeout.
func (d *Directory) directHTTP(inf *inflight, f *wire.IntentFrame, sender registry.Agent, endpoint string, pre []tracing.Event) {
	h, err := d.handOver(f, sender.PublicKeyB64, inf.jws, attestAuth(inf.vouchedBy), inf.vouchedBy)
	if err != nil {
		d.fail(inf, pre, CodeInvalidIntent, fmt.Sprintf("frame cannot be delivered: %v", err), false, nil)
		return
	}
	disp := inf.event(tracing.Dispatched, TransportDirectHTTP)
	disp.Details.TimeoutMs = d.cfg.DirectHTTPTimeout.Milliseconds()
	disp.Details.Extra = h.details(nil)
	if err := d.append(append(pre, disp)...); err != nil {
		d.abort(inf, err)
		return
	}
	d.mu.Lock()
	inf.transport = TransportDirectHTTP
	d.mu.Unlock()
	rf, err := d.postDirect(inf, h, endpoint)
	if err != nil {
		reason, msg := d.directFailed(inf.nonce, inf.to, err)
		extra := map[string]any{"fallbackReason": codeDirectHTTPFailed, "directHttpError": reason}
		if d.session(inf.to) == nil {
			d.fail(inf, nil, codeDirectHTTPFailed, msg, true, extra)
			return
		}
		d.deliverWS(inf, f, sender, nil, extra)
		return
	}
	d.mu.Lock()
	inf.finished = true
	d.mu.Unlock()
	d.finishWithResult(inf, rf, nil)
}

// directFailed logs a failed direct-HTTP delivery in full for the operator
// and returns what the sender and the trace get instead: the failure's
// category (directFailure) and the message naming it. The error itself
// (resolver addresses, transport detail) never leaves the server's log.
func (d *Directory) directFailed(nonce, to string, err error) (reason, msg string) {
	d.lg.Info("direct http delivery failed", "nonce", nonce, "to", to, "err", err)
	reason = directFailure(err)
	return reason, fmt.Sprintf("Direct HTTP delivery to %s failed: %s", to, reason)
}

// postDirect POSTs the intent to endpoint and maps the response to a
// result frame: a beam/1 result is used as is, {success, ...} is wrapped,
// any other JSON becomes a successful result's payload. An attested frame
// carries the attestation signature in X-Beam-Signature, the attestation
// key in X-Beam-Attestation-Key and the attestation member (JSON) in
// X-Beam-Attestation.
func (d *Directory) postDirect(inf *inflight, h handOver, endpoint string) (*wire.ResultFrame, error) {
	f := h.frame
	payload := json.RawMessage(f.Payload)
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	body, err := json.Marshal(struct {
		Intent    string          `json:"intent"`
		From      string          `json:"from"`
		Payload   json.RawMessage `json:"payload"`
		Nonce     string          `json:"nonce"`
		Timestamp string          `json:"timestamp"`
	}{f.Intent, f.From, payload, f.Nonce, f.Timestamp})
	if err != nil {
		return nil, fmt.Errorf("encode body: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.DirectHTTPTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderSender, f.From)
	req.Header.Set(wire.HeaderSignature, f.Signature)
	req.Header.Set(wire.HeaderNonce, f.Nonce)
	req.Header.Set(wire.HeaderTimestamp, f.Timestamp)
	if inf.jws != "" {
		req.Header.Set(wire.HeaderIntentJWS, inf.jws)
	}
	if h.attested != nil {
		member, err := json.Marshal(h.attested)
		if err != nil {
			return nil, fmt.Errorf("encode attestation: %w", err)
		}
		req.Header.Set(wire.HeaderAttestation, string(member))
		req.Header.Set(wire.HeaderAttestationKey, h.senderKey)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("post: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(d.cfg.MaxMessageBytes)+1))
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &endpointStatusError{code: resp.StatusCode}
	}
	if len(data) > d.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("%w exceeds %d bytes", errEndpointResponse, d.cfg.MaxMessageBytes)
	}
	return d.mapDirectResponse(inf, data)
}

func (d *Directory) mapDirectResponse(inf *inflight, data []byte) (*wire.ResultFrame, error) {
	data = bytes.TrimSpace(data)
	if !json.Valid(data) {
		return nil, fmt.Errorf("%w is not JSON", errEndpointResponse)
	}
	var probe map[string]json.RawMessage
	isObject := json.Unmarshal(data, &probe) == nil && probe != nil
	if isObject {
		var v string
		_ = json.Unmarshal(probe["v"], &v)
		var success *bool
		_ = json.Unmarshal(probe["success"], &success)
		if v == wire.Version && success != nil {
			if rf, err := wire.DecodeResultFrame(data); err == nil && rf.Nonce == inf.nonce {
				return rf, nil
			}
		}
		if success != nil {
			res := wire.Result{Success: *success, Nonce: inf.nonce}
			if p := probe["payload"]; len(p) > 0 && strings.HasPrefix(string(bytes.TrimSpace(p)), "{") {
				res.Payload = p
			}
			_ = json.Unmarshal(probe["error"], &res.Error)
			_ = json.Unmarshal(probe["errorCode"], &res.ErrorCode)
			var lat float64
			if json.Unmarshal(probe["latency"], &lat) == nil && lat >= 0 && lat < 1e12 {
				l := int64(lat)
				res.Latency = &l
			}
			return buildResult(res, d.clock())
		}
	}
	payload := data
	if !isObject {
		wrapped, err := json.Marshal(map[string]json.RawMessage{"response": data})
		if err != nil {
			return nil, fmt.Errorf("wrap response: %w", err)
		}
		payload = wrapped
	}
	return buildResult(wire.Result{Success: true, Nonce: inf.nonce, Payload: payload}, d.clock())
}

func buildResult(res wire.Result, now time.Time) (*wire.ResultFrame, error) {
	raw, err := res.Build(now, nil)
	if err != nil {
		return nil, fmt.Errorf("build result: %w", err)
	}
	rf, err := wire.DecodeResultFrame(raw)
	if err != nil {
		return nil, fmt.Errorf("build result: %w", err)
	}
	return rf, nil
}
