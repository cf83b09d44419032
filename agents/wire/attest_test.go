package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAttestIntentRoundTrip(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	f, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)
	require.NoError(t, AttestIntent(f, b.priv))
	require.Len(t, f.Signature, 88)

	// What a recipient decodes from the delivered bytes verifies strictly.
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	got, err := DecodeIntentFrame(raw)
	require.NoError(t, err)
	require.NoError(t, VerifyAttested(got, b.pub))
	require.NoError(t, got.Verify(b.pub), "a beam/1 receiver (SDK 0.5.1) verifies it as usual")

	// Any change to a signed field breaks it.
	tampered := *got
	tampered.From = "mallory@acme.beam.directory"
	require.ErrorIs(t, VerifyAttested(&tampered, b.pub), ErrBadSignature)
	other := setupIntent(t)
	require.ErrorIs(t, VerifyAttested(got, other.pub), ErrBadSignature)

	// A sender-signed frame is never re-signed.
	require.Error(t, AttestIntent(got, b.priv))
}

func TestVerifyAttestedAcceptsOnlyTheExactSigningInput(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	// Signed over the compacted wire bytes (an alternate form Verify allows
	// for senders), not over the JavaScript form.
	f, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)
	f.Signature = Sign(f.appendEnvelope(nil, appendJSString, compactJSON(f.Payload)), b.priv)
	require.NoError(t, f.Verify(b.pub))
	require.ErrorIs(t, VerifyAttested(f, b.pub), ErrBadSignature)
}

func TestSignedDeliverySizeCountsTheSignature(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	f := NewIntentFrame("a@acme.beam.directory", "b@acme.beam.directory", "x", json.RawMessage(`{"m":"ü"}`), time.Now())
	unsigned, err := f.DeliverySize()
	require.NoError(t, err)
	predicted, err := f.SignedDeliverySize()
	require.NoError(t, err)
	require.NoError(t, AttestIntent(f, b.priv))
	signed, err := f.DeliverySize()
	require.NoError(t, err)
	require.Equal(t, signed, predicted)
	require.Greater(t, signed, unsigned)
}

func TestAttestationValidate(t *testing.T) {
	t.Parallel()
	ok := Attestation{By: "acme.beam.directory", KeyID: "k", Auth: AttestBusKey}
	require.NoError(t, ok.Validate())
	for _, bad := range []Attestation{
		{KeyID: "", Auth: AttestAPIKey},
		{KeyID: strings.Repeat("k", 65), Auth: AttestAPIKey},
		{KeyID: "k", Auth: "signature"},
		{KeyID: "k", Auth: AttestPeer, VouchedBy: strings.Repeat("p", 257)},
	} {
		require.Error(t, bad.Validate(), "%+v", bad)
	}
	var none *Attestation
	require.Error(t, none.Validate())
}

func TestDecodeAttestationKeys(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	doc := AttestationKeys{By: "acme.beam.directory", Keys: []AttestationKey{
		{KeyID: AttestationKeyID(b.pub), PublicKey: EncodePublicKey(b.pub), Algorithm: "Ed25519"},
	}}
	raw, err := json.Marshal(doc)
	require.NoError(t, err)
	got, keys, err := DecodeAttestationKeys(raw)
	require.NoError(t, err)
	require.Equal(t, doc, *got)
	require.True(t, b.pub.Equal(keys[AttestationKeyID(b.pub)]))

	other := setupIntent(t)
	for name, mutate := range map[string]func(*AttestationKeys){
		"no keys":         func(d *AttestationKeys) { d.Keys = nil },
		"wrong key id":    func(d *AttestationKeys) { d.Keys[0].KeyID = AttestationKeyID(other.pub) },
		"other algorithm": func(d *AttestationKeys) { d.Keys[0].Algorithm = "RS256" },
		"not a key":       func(d *AttestationKeys) { d.Keys[0].PublicKey = "bm90IGEga2V5" },
	} {
		d := AttestationKeys{By: doc.By, Keys: append([]AttestationKey(nil), doc.Keys...)}
		mutate(&d)
		raw, err := json.Marshal(d)
		require.NoError(t, err)
		_, _, err = DecodeAttestationKeys(raw)
		require.Error(t, err, name)
	}
}

// FuzzDecodeAttestationKeys: a document that decodes lists only keys whose
// id names them, and encodes back to a document that decodes to the same
// keys.
func FuzzDecodeAttestationKeys(f *testing.F) {
	pub, _, err := GenerateKey()
	if err != nil {
		f.Fatal(err)
	}
	good, _ := json.Marshal(AttestationKeys{By: "x.beam.directory", Keys: []AttestationKey{
		{KeyID: AttestationKeyID(pub), PublicKey: EncodePublicKey(pub), Algorithm: "Ed25519"},
	}})
	f.Add(good)
	f.Add([]byte(`{"keys":[]}`))
	f.Add([]byte(`{"by":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, keys, err := DecodeAttestationKeys(data)
		if err != nil {
			return
		}
		for id, k := range keys {
			if AttestationKeyID(k) != id {
				t.Fatalf("key id %q does not name its key", id)
			}
		}
		again, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		_, keys2, err := DecodeAttestationKeys(again)
		if err != nil {
			t.Fatalf("re-encoded document does not decode: %v", err)
		}
		if len(keys2) != len(keys) {
			t.Fatalf("round trip changed the keys: %d → %d", len(keys), len(keys2))
		}
	})
}
