package wire

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"
)

type jwsBundle struct {
	id    string
	pub   ed25519.PublicKey
	priv  ed25519.PrivateKey
	keyOf func(kid string) (ed25519.PublicKey, error)
}

func setupJWS(t *testing.T) *jwsBundle {
	t.Helper()
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	b := &jwsBundle{id: "a@acme.beam.directory", pub: pub, priv: priv}
	b.keyOf = func(kid string) (ed25519.PublicKey, error) {
		if kid != b.id {
			return nil, errors.New("unknown agent")
		}
		return b.pub, nil
	}
	return b
}

func TestJWSRoundTrip(t *testing.T) {
	t.Parallel()
	b := setupJWS(t)
	f := NewIntentFrame(b.id, "b@beam.directory", "agent.ping", []byte(`{"x":1}`), time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC))
	frame, err := f.DeliveryJSON()
	require.NoError(t, err)
	token, err := SignJWS(TypIntentJWS, frame, b.id, b.priv)
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(token, "."))

	payload, kid, err := VerifyJWS(token, TypIntentJWS, b.keyOf)
	require.NoError(t, err)
	require.Equal(t, b.id, kid)
	require.Equal(t, string(frame), string(payload))

	g, err := DecodeIntentJWS(token, b.keyOf)
	require.NoError(t, err)
	require.Equal(t, f.Nonce, g.Nonce)

	// Wrong typ, unknown kid, wrong key, tampered payload.
	_, _, err = VerifyJWS(token, TypResultJWS, b.keyOf)
	require.ErrorIs(t, err, ErrJWS)
	_, _, err = VerifyJWS(token, TypIntentJWS, func(string) (ed25519.PublicKey, error) { return nil, errors.New("nope") })
	require.ErrorIs(t, err, ErrJWS)
	other, _, err := GenerateKey()
	require.NoError(t, err)
	_, _, err = VerifyJWS(token, TypIntentJWS, func(string) (ed25519.PublicKey, error) { return other, nil })
	require.ErrorIs(t, err, ErrBadSignature)
	parts := strings.Split(token, ".")
	forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"x":2}`)) + "." + parts[2]
	_, _, err = VerifyJWS(forged, TypIntentJWS, b.keyOf)
	require.ErrorIs(t, err, ErrBadSignature)

	// kid must be the intent's sender.
	token2, err := SignJWS(TypIntentJWS, frame, "c@beam.directory", b.priv)
	require.NoError(t, err)
	_, err = DecodeIntentJWS(token2, func(string) (ed25519.PublicKey, error) { return b.pub, nil })
	require.ErrorIs(t, err, ErrJWS)
}

func TestJWSRejects(t *testing.T) {
	t.Parallel()
	b := setupJWS(t)
	// Other algorithms are not accepted.
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: ek, KeyID: b.id}},
		(&jose.SignerOptions{}).WithType(TypIntentJWS))
	require.NoError(t, err)
	obj, err := signer.Sign([]byte(`{}`))
	require.NoError(t, err)
	tok, err := obj.CompactSerialize()
	require.NoError(t, err)
	_, _, err = VerifyJWS(tok, TypIntentJWS, b.keyOf)
	require.ErrorIs(t, err, ErrJWS)

	// Embedded JWK is rejected even when its signature is valid.
	signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: b.priv},
		(&jose.SignerOptions{EmbedJWK: true}).WithType(TypIntentJWS).WithHeader("kid", b.id))
	require.NoError(t, err)
	obj, err = signer.Sign([]byte(`{}`))
	require.NoError(t, err)
	tok, err = obj.CompactSerialize()
	require.NoError(t, err)
	_, _, err = VerifyJWS(tok, TypIntentJWS, b.keyOf)
	require.ErrorContains(t, err, "jwk")

	// Missing kid and missing typ.
	signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: b.priv}, (&jose.SignerOptions{}).WithType(TypIntentJWS))
	require.NoError(t, err)
	obj, err = signer.Sign([]byte(`{}`))
	require.NoError(t, err)
	tok, err = obj.CompactSerialize()
	require.NoError(t, err)
	_, _, err = VerifyJWS(tok, TypIntentJWS, b.keyOf)
	require.ErrorContains(t, err, "kid")
	signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: b.priv, KeyID: b.id}}, nil)
	require.NoError(t, err)
	obj, err = signer.Sign([]byte(`{}`))
	require.NoError(t, err)
	tok, err = obj.CompactSerialize()
	require.NoError(t, err)
	_, _, err = VerifyJWS(tok, TypIntentJWS, b.keyOf)
	require.ErrorContains(t, err, "typ")

	// "alg":"none" and oversize tokens.
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"a@acme.beam.directory","typ":"beam-intent+jws"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`{}`)) + "."
	_, _, err = VerifyJWS(none, TypIntentJWS, b.keyOf)
	require.ErrorIs(t, err, ErrJWS)
	_, _, err = VerifyJWS(strings.Repeat("a", MaxJWSBytes+1), TypIntentJWS, b.keyOf)
	require.ErrorIs(t, err, ErrJWS)

	_, err = SignJWS(TypIntentJWS, []byte(`{}`), "", b.priv)
	require.Error(t, err)
	_, err = SignJWS(TypIntentJWS, []byte(`{}`), b.id, b.priv[:3])
	require.Error(t, err)
}

func FuzzVerifyJWS(f *testing.F) {
	pub, priv, err := GenerateKey()
	if err != nil {
		f.Fatal(err)
	}
	good, err := SignJWS(TypResultJWS, []byte(`{"v":"1","success":true,"nonce":"n","timestamp":"t"}`), "a@beam.directory", priv)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJFZERTQSJ9..")
	f.Add(strings.Replace(good, ".", "..", 1))
	resolve := func(string) (ed25519.PublicKey, error) { return pub, nil }
	f.Fuzz(func(t *testing.T, token string) {
		payload, _, err := VerifyJWS(token, TypResultJWS, resolve)
		if err != nil {
			if !errors.Is(err, ErrJWS) {
				t.Fatalf("error does not wrap ErrJWS: %v", err)
			}
			return
		}
		if token != good && string(payload) != `{"v":"1","success":true,"nonce":"n","timestamp":"t"}` {
			t.Fatalf("forged token verified: %q", token)
		}
	})
}

func FuzzDecodeIntentFrame(f *testing.F) {
	f.Add([]byte(testFrame))
	f.Add([]byte(`{"from":"a","to":"b","intent":"i","params":{"x":[1,2]},"nonce":"n","timestamp":"t","signature":"s","extra":{"1":2}}`))
	f.Add([]byte(`{"from":"a","to":"b","intent":"i","payload":{"x":"\ud800"},"nonce":"n","timestamp":"t","payload":{}}`))
	_, priv, err := GenerateKey()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeIntentFrame(data)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || fe.Code != CodeInvalidIntent {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		if _, err := fr.SigningInput(); err != nil {
			t.Fatalf("SigningInput of accepted frame: %v", err)
		}
		d, err := fr.DeliveryJSON()
		if err != nil {
			t.Fatalf("DeliveryJSON: %v", err)
		}
		g, err := DecodeIntentFrame(d)
		if err != nil {
			t.Fatalf("delivery frame %q does not decode: %v", d, err)
		}
		if string(g.Payload) != string(fr.Payload) || g.Nonce != fr.Nonce || g.From != fr.From {
			t.Fatalf("delivery changed the frame: %q -> %q", data, d)
		}
		if err := SignIntent(g, priv); err != nil {
			t.Fatalf("sign: %v", err)
		}
		if err := g.Verify(priv.Public().(ed25519.PublicKey)); err != nil {
			t.Fatalf("verify after sign: %v", err)
		}
	})
}
