package wire

import (
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func benchFrame(b *testing.B) (ed25519.PublicKey, *IntentFrame, []byte) {
	b.Helper()
	pub, priv, err := GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	payload := `{"message":"` + strings.Repeat("Grüße ", 200) + `","n":[1.0,2.5,1e21],"nested":{"2":"x","b":{"c":true}}}`
	f := NewIntentFrame("a@acme.beam.directory", "b@beam.directory", "conversation.message", json.RawMessage(payload), time.Unix(0, 0))
	if err := SignIntent(f, priv); err != nil {
		b.Fatal(err)
	}
	d, err := f.DeliveryJSON()
	if err != nil {
		b.Fatal(err)
	}
	return pub, f, d
}

// BenchmarkJSStringify measures re-serializing a ~1.5 KB payload as JavaScript would.
func BenchmarkJSStringify(b *testing.B) {
	_, f, _ := benchFrame(b)
	b.SetBytes(int64(len(f.Payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := JSStringify(f.Payload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeVerifyIntent measures the directory's per-frame work: decode, verify (Ed25519
// included), delivery bytes and delivery size.
func BenchmarkDecodeVerifyIntent(b *testing.B) {
	pub, _, d := benchFrame(b)
	b.SetBytes(int64(len(d)))
	b.ReportAllocs()
	for b.Loop() {
		fr, err := DecodeIntentFrame(d)
		if err != nil {
			b.Fatal(err)
		}
		if err := fr.Verify(pub); err != nil {
			b.Fatal(err)
		}
		if _, err := fr.DeliverySize(); err != nil {
			b.Fatal(err)
		}
	}
}
