package wire

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeyRoundTrip(t *testing.T) {
	t.Parallel()
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	enc := EncodePublicKey(pub)
	require.Len(t, enc, 60)
	require.True(t, strings.HasPrefix(enc, "MCowBQYDK2VwAyEA"))
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	require.Equal(t, base64.StdEncoding.EncodeToString(der), enc)
	back, err := ParsePublicKey(enc)
	require.NoError(t, err)
	require.Equal(t, pub, back)

	penc := EncodePrivateKey(priv)
	pder, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	require.Equal(t, base64.StdEncoding.EncodeToString(pder), penc)
	pback, err := ParsePrivateKey(penc)
	require.NoError(t, err)
	require.Equal(t, priv, pback)

	// Unpadded base64 and surrounding whitespace are tolerated.
	back, err = ParsePublicKey(" " + strings.TrimRight(enc, "=") + "\n")
	require.NoError(t, err)
	require.Equal(t, pub, back)
}

func TestKeyRejectsOtherTypes(t *testing.T) {
	t.Parallel()
	rk, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	require.NoError(t, err)
	_, err = ParsePublicKey(base64.StdEncoding.EncodeToString(der))
	require.ErrorIs(t, err, ErrNotEd25519)
	require.ErrorContains(t, err, "rsa")

	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pder, err := x509.MarshalPKCS8PrivateKey(ek)
	require.NoError(t, err)
	_, err = ParsePrivateKey(base64.StdEncoding.EncodeToString(pder))
	require.ErrorIs(t, err, ErrNotEd25519)

	for _, bad := range []string{"", "!!!", "AAAA", strings.Repeat("A", maxKeyText+1)} {
		_, err := ParsePublicKey(bad)
		require.Error(t, err, bad)
		_, err = ParsePrivateKey(bad)
		require.Error(t, err, bad)
	}
}

func TestSignAndVerifySignature(t *testing.T) {
	t.Parallel()
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	sig := Sign([]byte("msg"), priv)
	require.Len(t, sig, 88)
	require.NoError(t, VerifySignature([]byte("msg"), sig, pub))
	require.ErrorIs(t, VerifySignature([]byte("msh"), sig, pub), ErrBadSignature)
	require.ErrorIs(t, VerifySignature([]byte("msg"), "", pub), ErrBadSignature)
	require.ErrorIs(t, VerifySignature([]byte("msg"), "AAAA", pub), ErrBadSignature)
	require.ErrorIs(t, VerifySignature([]byte("msg"), sig, pub[:10]), ErrBadSignature)
}
