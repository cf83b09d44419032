package federation

import (
	"crypto/ed25519"
	"testing"
	"time"
)

func FuzzParsePeerLine(f *testing.F) {
	f.Add("alpha.beam.directory=nats://127.0.0.1:4222#" + EncodeKey(make([]byte, 32)))
	f.Add("x=y#z")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePeerLine(s)
		if err != nil {
			return
		}
		q, err := ParsePeerLine(p.Line())
		if err != nil || q.Line() != p.Line() {
			t.Fatalf("line %q does not round-trip: %v", p.Line(), err)
		}
	})
}

func FuzzOpenMessage(f *testing.F) {
	_, priv, _ := ed25519.GenerateKey(nil)
	now := time.Now()
	tok, _ := seal(&Message{Kind: KindIntent, ID: "1", From: "alpha.beam.directory", To: "beta.beam.directory",
		IssuedAt: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli()}, priv)
	f.Add(tok)
	f.Add([]byte("a.b.c"))
	f.Add([]byte{})
	keys := func(d string) (ed25519.PublicKey, bool) {
		if d == "alpha.beam.directory" {
			return priv.Public().(ed25519.PublicKey), true
		}
		return nil, false
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = open(b, "beta.beam.directory", "alpha.beam.directory", KindIntent, keys, now)
	})
}
