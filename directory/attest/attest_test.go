package attest

import (
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

func TestKeyIsCreatedOnceAndKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, err := LoadOrCreate(dir, "acme.beam.directory")
	require.NoError(t, err)
	st, err := os.Stat(filepath.Join(dir, KeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	b, err := LoadOrCreate(dir, "acme.beam.directory")
	require.NoError(t, err)
	require.Equal(t, a.PublicKey(), b.PublicKey())
	require.Equal(t, a.KeyID(), b.KeyID())

	require.NoError(t, os.WriteFile(filepath.Join(dir, KeyFile), []byte("not a seed\n"), 0o600))
	_, err = LoadOrCreate(dir, "acme.beam.directory")
	require.ErrorContains(t, err, "not a base64url Ed25519 seed")
}

func TestAttestSignsACopyAndServesItsKey(t *testing.T) {
	t.Parallel()
	a, err := Ephemeral("acme.beam.directory")
	require.NoError(t, err)
	f := wire.NewIntentFrame("alice@acme.beam.directory", "bob@acme.beam.directory", "job.run",
		json.RawMessage(`{"n":1}`), time.Now())
	g, member, err := a.Attest(f, wire.AttestPeer, "beta.beam.directory")
	require.NoError(t, err)
	require.Empty(t, f.Signature, "the given frame is not changed")
	require.Equal(t, wire.Attestation{By: "acme.beam.directory", KeyID: a.KeyID(), Auth: wire.AttestPeer,
		VouchedBy: "beta.beam.directory"}, member)
	_, _, err = a.Attest(g, wire.AttestAPIKey, "")
	require.Error(t, err, "a signed frame is never attested over")

	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + wire.AttestationKeysPath)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	doc, keys, err := wire.DecodeAttestationKeys(body)
	require.NoError(t, err)
	require.Equal(t, "acme.beam.directory", doc.By)
	require.NoError(t, wire.VerifyAttested(g, keys[member.KeyID]))
}

func TestNewRefusesABadKey(t *testing.T) {
	t.Parallel()
	_, err := newAttester(ed25519.PrivateKey([]byte{1, 2, 3}), "x")
	require.Error(t, err)
}

// BenchmarkAttest is the cost attestation adds to one delivery attempt of
// an unsigned frame.
func BenchmarkAttest(b *testing.B) {
	a, err := Ephemeral("acme.beam.directory")
	require.NoError(b, err)
	f := wire.NewIntentFrame("alice@acme.beam.directory", "bob@acme.beam.directory", "job.run",
		json.RawMessage(`{"n":1,"text":"grüße","items":[1,2,3],"nested":{"a":true}}`), time.Now())
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := a.Attest(f, wire.AttestAPIKey, ""); err != nil {
			b.Fatal(err)
		}
	}
}
