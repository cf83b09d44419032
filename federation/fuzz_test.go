package federation

import (
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	tok, _ := seal(&Message{Kind: kindIntent, ID: "1", From: "alpha.beam.directory", To: "beta.beam.directory",
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
		m, err := open(b, "beta.beam.directory", "alpha.beam.directory", kindIntent, keys, now)
		if err != nil {
			require.Nil(t, m)
			var rej *rejectError
			require.True(t, errors.As(err, &rej), "an open error is a RejectError with a reason: %v", err)
			return
		}
		// Invariant: nothing but a message alpha signed opens, and it
		// opens as exactly what was signed, for the expected hop.
		require.Equal(t, "alpha.beam.directory", m.From)
		require.Equal(t, "beta.beam.directory", m.To)
		require.Equal(t, kindIntent, m.Kind)
		require.Equal(t, "1", m.ID, "a message alpha never signed opened: %q", b)
		again, err := seal(m, priv)
		require.NoError(t, err)
		m2, err := open(again, "beta.beam.directory", "alpha.beam.directory", kindIntent, keys, now)
		require.NoError(t, err)
		require.Equal(t, m, m2, "an opened message re-seals to itself")
	})
}
