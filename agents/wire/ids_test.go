package wire

import (
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBeamID(t *testing.T) {
	t.Parallel()
	id, err := ParseBeamID("procurement@acme.beam.directory")
	require.NoError(t, err)
	require.Equal(t, BeamID{Agent: "procurement", Org: "acme"}, id)
	require.False(t, id.Personal())
	require.Equal(t, "acme.beam.directory", id.Domain())
	require.Equal(t, "did:beam:acme:procurement", id.DID())
	require.Equal(t, "procurement@acme.beam.directory", id.String())

	id, err = ParseBeamID("echo@beam.directory")
	require.NoError(t, err)
	require.Equal(t, BeamID{Agent: "echo"}, id)
	require.True(t, id.Personal())
	require.Equal(t, "beam.directory", id.Domain())
	require.Equal(t, "did:beam:echo", id.DID())

	_, err = ParseBeamID("a_b-9@x_y-1.beam.directory")
	require.NoError(t, err)
	_, err = ParseBeamID(strings.Repeat("a", 63) + "@" + strings.Repeat("b", 63) + ".beam.directory")
	require.NoError(t, err)

	for _, bad := range []string{
		"", "agent", "@beam.directory", "Agent@beam.directory", "agent@ACME.beam.directory",
		"agent@a.b.beam.directory", "agent@.beam.directory", "agent@beam.id", "agent@acme.beam.id",
		"agent@beam.directory.", "a.b@beam.directory", "agent@acme.beam.directoryx", "a@b@beam.directory",
		"agent @beam.directory", strings.Repeat("a", 64) + "@beam.directory",
		"a@" + strings.Repeat("b", 64) + ".beam.directory", "agent@xbeam.directory",
	} {
		_, err := ParseBeamID(bad)
		require.ErrorIs(t, err, ErrInvalidBeamID, bad)
	}
}

func TestParseDID(t *testing.T) {
	t.Parallel()
	id, err := ParseDID("did:beam:acme:procurement")
	require.NoError(t, err)
	require.Equal(t, "procurement@acme.beam.directory", id.String())
	id, err = ParseDID("did:beam:echo")
	require.NoError(t, err)
	require.Equal(t, "echo@beam.directory", id.String())
	for _, bad := range []string{"did:web:x", "did:beam:", "did:beam:a:b:c", "did:beam:A", "did:beam::x", "did:beam:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"} {
		_, err := ParseDID(bad)
		require.ErrorIs(t, err, ErrInvalidBeamID, bad)
	}
}

func TestKeyDIDAndMultibase(t *testing.T) {
	t.Parallel()
	// The did:key test vector: a well-known Ed25519 key and its base58btc multibase.
	const mb = "z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
	pub, err := ParseMultibase(mb)
	require.NoError(t, err)
	require.Len(t, pub, ed25519.PublicKeySize)
	require.Equal(t, mb, Multibase(pub))
	require.Equal(t, "did:beam:"+mb, KeyDID(pub))
	back, err := ParseKeyDID(KeyDID(pub))
	require.NoError(t, err)
	require.Equal(t, pub, back)

	for i := 0; i < 20; i++ {
		p, _, err := GenerateKey()
		require.NoError(t, err)
		m := Multibase(p)
		require.True(t, strings.HasPrefix(m, "z6Mk"), m)
		q, err := ParseMultibase(m)
		require.NoError(t, err)
		require.Equal(t, p, q)
	}
	for _, bad := range []string{"", "f00", "z0OIl", "z" + strings.Repeat("1", 80), "z6Mk"} {
		_, err := ParseMultibase(bad)
		require.Error(t, err, bad)
	}
	_, err = ParseKeyDID("did:beam:acme:agent")
	require.Error(t, err)
}

func TestBase58(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"":                   "",
		"\x00":               "1",
		"\x00\x00\x01":       "112",
		"hello world":        "StV1DL6CwTryKyV",
		"\x00\x00hello":      "11Cn8eVZg",
		string([]byte{0xff}): "5Q",
	}
	for in, want := range cases {
		require.Equal(t, want, base58Encode([]byte(in)), "%q", in)
		back, err := base58Decode(want)
		require.NoError(t, err)
		require.Equal(t, in, string(back))
	}
}
