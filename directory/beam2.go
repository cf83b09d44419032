package directory

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
)

// This file is the directory's side of beam/2: intents and results that
// travel as compact JWS (EdDSA, kid = the signer's Beam ID). The envelope
// is verified once, in checkSignature, against the sender's registered key;
// from then on a beam/2 intent goes through exactly the pipeline of a
// beam/1 frame.

// Protocols a session may announce with the protocol query parameter.
const (
	protocolBeam1 = wire.ProtocolBeam1
	ProtocolBeam2 = wire.ProtocolBeam2
)

// codeUnsupportedProtocol: a beam/2 intent for a recipient whose session
// announced only beam/1 (its SDK could not verify the frame). HTTP 400.
const codeUnsupportedProtocol = "UNSUPPORTED_PROTOCOL"

// contentTypeJOSE is the content type of a POST /intents/send body that is
// a compact JWS.
const contentTypeJOSE = "application/jose"

// jwsSink receives the result JWS of a beam/2 intent for its sender.
type jwsSink struct {
	mu    sync.Mutex
	token string
}

func (s *jwsSink) set(token string) {
	s.mu.Lock()
	s.token = token
	s.mu.Unlock()
}

func (s *jwsSink) get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token
}

// sessionProtocols parses the protocol query parameters of an upgrade
// request ("beam/2", "beam/1,beam/2", or repeated). beam/1 is always
// spoken; unknown names are ignored. A beam/2 connect token implies beam/2.
func sessionProtocols(values []string, auth string) (beam2 bool, protocols []string) {
	beam2 = auth == authJWS
	for _, v := range values {
		for _, p := range strings.Split(v, ",") {
			if strings.TrimSpace(p) == ProtocolBeam2 {
				beam2 = true
			}
		}
	}
	if beam2 {
		return true, []string{protocolBeam1, ProtocolBeam2}
	}
	return false, []string{protocolBeam1}
}

// connectedMessage is the first message of a session.
func connectedMessage(s *session) []byte {
	protocols := []string{protocolBeam1}
	if s.beam2 {
		protocols = append(protocols, ProtocolBeam2)
	}
	b, _ := json.Marshal(struct {
		Type      string   `json:"type"`
		BeamID    string   `json:"beamId"`
		Auth      string   `json:"auth"`
		Protocols []string `json:"protocols"`
	}{"connected", s.beamID, s.auth, protocols})
	return b
}

// decodeJWSIntent reads the frame a beam/2 token carries. Nothing is
// verified yet: checkSignature verifies the token against the sender's key
// once the sender is resolved, and binds it to these exact bytes.
func decodeJWSIntent(token string) (*wire.IntentFrame, *RelayError) {
	payload, err := wire.PeekJWSPayload(token)
	if err != nil {
		return nil, relayErr(CodeInvalidIntent, "", "Invalid beam/2 envelope: %s", jwsReason(err))
	}
	f, err := wire.DecodeIntentFrame(payload)
	if err != nil {
		return nil, relayErr(CodeInvalidIntent, peekNonce(payload), "Invalid intent frame: %s", frameErrMsg(err))
	}
	return f, nil
}

// checkJWS verifies a beam/2 intent: EdDSA, typ beam-intent+jws, kid equal
// to the frame's from, signed by the sender's current key, and its payload
// byte for byte the frame being relayed.
func (d *Directory) checkJWS(f *wire.IntentFrame, sender registry.Agent, o RelayOptions) *RelayError {
	payload, _, err := wire.VerifyJWS(o.JWS, wire.TypIntentJWS, func(kid string) (ed25519.PublicKey, error) {
		if kid != f.From {
			return nil, fmt.Errorf("kid %q is not the intent's sender %q", kid, f.From)
		}
		return sender.PublicKey, nil
	})
	if err != nil {
		return relayErr(CodeInvalidIntent, f.Nonce, "JWS verification failed: %s", jwsReason(err))
	}
	if len(f.Raw) > 0 && !bytes.Equal(payload, f.Raw) {
		return relayErr(CodeInvalidIntent, f.Nonce, "JWS verification failed: payload is not the relayed frame")
	}
	return nil
}

// jwsReason is the client-facing text of a JWS failure.
func jwsReason(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, wire.ErrJWS.Error()+": ")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// beam2Details are the extra details of the received event of a beam/2
// intent.
func beam2Details(o RelayOptions, extra map[string]any) {
	if o.JWS == "" {
		return
	}
	extra["protocol"] = ProtocolBeam2
	extra["jws"] = o.JWS
}

// unsupportedProtocol is the failure of a beam/2 intent to a beam/1-only
// session.
func unsupportedProtocol(to string) string {
	return fmt.Sprintf("Recipient %s speaks beam/1 only: its session did not announce beam/2, so it cannot verify a beam/2 intent; send it as beam/1", to)
}

// withJWSMember appends "jws":token to a JSON object message.
func withJWSMember(msg []byte, token string) []byte {
	if token == "" || len(msg) < 2 {
		return msg
	}
	q, _ := json.Marshal(token)
	out := make([]byte, 0, len(msg)+len(q)+8)
	out = append(out, msg[:len(msg)-1]...)
	out = append(out, `,"jws":`...)
	out = append(out, q...)
	return append(out, '}')
}

// noteResultJWS hands a result's JWS to the intent's sender and returns the
// details that record it; nil for a beam/1 result.
func (d *Directory) noteResultJWS(inf *inflight, token string) map[string]any {
	if token == "" {
		return nil
	}
	if inf.resultJWS != nil {
		inf.resultJWS.set(token)
	}
	return map[string]any{"resultJWS": token, "resultProtocol": ProtocolBeam2}
}

// handleWSIntentJWS relays a beam/2 intent a session sent as
// {"type":"intent","jws":…}. A result the recipient signed as JWS comes back
// as {"type":"result","frame":…,"jws":…}.
func (d *Directory) handleWSIntentJWS(s *session, token string) {
	f, rerr := decodeJWSIntent(token)
	if rerr != nil {
		d.rejectFrame(rerr, s.beamID, originWS)
		s.sendOutcome(rerr.Nonce, nil, rerr)
		return
	}
	sink := &jwsSink{}
	opts := RelayOptions{Origin: originWS, SessionBeamID: s.beamID, JWS: token, resultJWS: sink}
	nonce := f.Nonce
	d.submit(s.context(), f, opts, func(res []byte, rerr *RelayError) {
		if rerr == nil {
			if t := sink.get(); t != "" {
				s.enqueue(outMsg{data: withJWSMember(resultMessage(res), t)})
				return
			}
		}
		s.sendOutcome(nonce, res, rerr)
	})
}

// handleResultJWS takes {"type":"result","jws":…}: the token must be signed
// by the session's agent (kid = its Beam ID, its registered key); the frame
// inside then settles the intent as a beam/1 result would.
func (d *Directory) handleResultJWS(s *session, token string) {
	rf, _, err := wire.DecodeResultJWS(token, func(kid string) (ed25519.PublicKey, error) {
		if kid != s.beamID {
			return nil, fmt.Errorf("kid %q is not this session's agent %s", kid, s.beamID)
		}
		a, ok := d.reg.Get(kid)
		if !ok {
			return nil, fmt.Errorf("agent %s is not registered", kid)
		}
		return a.PublicKey, nil
	})
	if err != nil {
		nonce := ""
		if p, perr := wire.PeekJWSPayload(token); perr == nil {
			nonce = peekNonce(p)
		}
		d.m.rejected.WithLabelValues(wire.CodeInvalidResult).Inc()
		d.lg.Warn("result JWS refused", "session", s.beamID, "nonce", nonce, "err", err)
		msg := "Invalid result JWS: " + jwsReason(err)
		var fe *wire.FrameError
		if errors.As(err, &fe) {
			msg = "Invalid result frame: " + frameErrMsg(fe)
		}
		s.sendError(nonce, wire.CodeInvalidResult, msg)
		return
	}
	d.takeResult(s, rf, token)
}

// sendJWSToken returns the compact JWS of a beam/2 POST /intents/send:
// the whole body with Content-Type application/jose, or the "jws" member of
// a JSON body {"jws": "…"}.
func sendJWSToken(r *http.Request, body []byte) (string, bool) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == contentTypeJOSE {
		return string(bytes.TrimSpace(body)), true
	}
	if !bytes.Contains(body, []byte(`"jws"`)) {
		return "", false
	}
	var v struct {
		JWS *string `json:"jws"`
	}
	if json.Unmarshal(body, &v) != nil || v.JWS == nil {
		return "", false
	}
	return *v.JWS, true
}

// handleSendJWS serves a beam/2 POST /intents/send: the same answers as for
// a beam/1 frame, plus the recipient's result JWS in X-Beam-Result-JWS.
func (d *Directory) handleSendJWS(w http.ResponseWriter, r *http.Request, token string) error {
	f, rerr := decodeJWSIntent(token)
	if rerr != nil {
		d.rejectFrame(rerr, "", originHTTP)
		return rerr.httpErr()
	}
	sink := &jwsSink{}
	res, rerr := d.Relay(r.Context(), f, RelayOptions{Origin: originHTTP, JWS: token, resultJWS: sink})
	if rerr != nil {
		return rerr.httpErr()
	}
	if t := sink.get(); t != "" {
		w.Header().Set(wire.HeaderResultJWS, t)
	}
	writeRaw(w, http.StatusOK, res)
	return nil
}
