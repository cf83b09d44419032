package directory

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/beamdir/beam/agents/wire"
)

func FuzzDecodeWSMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"intent","frame":{"v":"1","intent":"a.b","from":"a@x.beam.directory","to":"b@x.beam.directory","payload":{},"nonce":"n","timestamp":"2026-01-01T00:00:00.000Z","signature":"c2ln"}}`,
		`{"type":"result","frame":{"v":"1","success":true,"nonce":"n","timestamp":"t","payload":{"terminal":false}}}`,
		`{"type":"result","frame":null}`,
		`{"type":7}`, `{"type":"intent","frame":"x"}`, `[]`, `null`, `"x"`, ``, ` {"type":"ping"}`, `{"TYPE":"intent"}`,
		`{"type":"intent","frame":{"payload":{"__proto__":1},"nonce":{"a":1}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeWSMessage(data)
		if err != nil {
			if m.Type != "" || m.Frame != nil {
				t.Fatalf("error with a decoded message: %+v", m)
			}
			return
		}
		switch m.Type {
		case "intent":
			peeked := peekNonce(m.Frame)
			if fr, err := wire.DecodeIntentFrame(m.Frame); err == nil {
				// Invariant: the nonce an error reply names is the
				// nonce of the frame the relay decodes.
				if len(fr.Nonce) <= 256 && peeked != fr.Nonce {
					t.Fatalf("peekNonce %q, decoded nonce %q in %q", peeked, fr.Nonce, m.Frame)
				}
				_, _ = payloadHash(fr.Payload)
				_, _ = intentMessage(fr, "key")
				_, _ = echoPayload(fr)
			}
		case "result":
			if rf, err := wire.DecodeResultFrame(m.Frame); err == nil {
				_ = wire.IsAsyncAcceptance(rf)
				_ = resultMessage(rf.Raw)
			}
		}
	})
}

// FuzzSendBody posts arbitrary bodies to POST /intents/send: never a panic,
// never a 500 and never a 2xx for garbage.
func FuzzSendBody(f *testing.F) {
	b := setup(f)
	for _, s := range []string{
		`{}`, `{"intent":`, `[1]`, `{"v":"1","intent":"x","from":"a@acme.beam.directory","to":"echo@beam.directory","payload":{},"nonce":"n","timestamp":"2026-01-01T00:00:00.000Z","signature":"AAAA"}`,
		`{"v":"1","intent":"x","from":"a","to":"b","params":{"a":[1,2,{"b":null}]},"nonce":"n","timestamp":"t"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/intents/send", bytes.NewReader(body))
		b.dir.handleSend(rec, req)
		if rec.Code >= 500 || rec.Code < 400 {
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.String())
		}
	})
}
