package wire

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// jsVectors mirrors fixtures/wire/js-vectors.json (written by fixtures/vectors-js/gen.mjs).
type jsVectors struct {
	Key struct {
		SeedHex          string `json:"seedHex"`
		PublicKeyBase64  string `json:"publicKeyBase64"`
		PrivateKeyBase64 string `json:"privateKeyBase64"`
	} `json:"key"`
	Intents []struct {
		Name          string `json:"name"`
		Wire          string `json:"wire"`
		SigningString string `json:"signingString"`
		Signature     string `json:"signature"`
		PayloadJS     string `json:"payloadJS"`
	} `json:"intents"`
	Results []struct {
		Name          string `json:"name"`
		Wire          string `json:"wire"`
		SigningString string `json:"signingString"`
		Signature     string `json:"signature"`
	} `json:"results"`
	Stringify []struct {
		Name      string `json:"name"`
		Input     string `json:"input"`
		JS        string `json:"js"`
		Canonical string `json:"canonical"`
	} `json:"stringify"`
	Numbers []struct {
		Bits string `json:"bits"`
		JS   string `json:"js"`
	} `json:"numbers"`
}

func loadJSVectors(t *testing.T) *jsVectors {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "fixtures", "wire", "js-vectors.json"))
	require.NoError(t, err, "run `node gen.mjs` in fixtures/vectors-js to create the vectors")
	var v jsVectors
	require.NoError(t, json.Unmarshal(data, &v))
	return &v
}

func TestJSVectorsKey(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	priv, err := ParsePrivateKey(v.Key.PrivateKeyBase64)
	require.NoError(t, err)
	pub, err := ParsePublicKey(v.Key.PublicKeyBase64)
	require.NoError(t, err)
	require.Equal(t, pub, priv.Public())
	require.Equal(t, v.Key.PublicKeyBase64, EncodePublicKey(pub))
	require.Equal(t, v.Key.PrivateKeyBase64, EncodePrivateKey(priv))
}

func TestJSVectorsIntents(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	pub, err := ParsePublicKey(v.Key.PublicKeyBase64)
	require.NoError(t, err)
	priv, err := ParsePrivateKey(v.Key.PrivateKeyBase64)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(v.Intents), 10)
	for _, vec := range v.Intents {
		f, err := DecodeIntentFrame([]byte(vec.Wire))
		if CheckNoDuplicateKeys([]byte(vec.Wire)) != nil {
			// JSON.parse would take the last value; a first-wins recipient
			// would read another frame than the signer signed, so it is refused.
			var dup *DuplicateKeyError
			require.ErrorAs(t, err, &dup, vec.Name)
			continue
		}
		require.NoError(t, err, vec.Name)
		in, err := f.SigningInput()
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.SigningString, string(in), vec.Name)
		require.Equal(t, vec.Signature, f.Signature, vec.Name)
		require.NoError(t, f.Verify(pub), vec.Name)

		payload, err := JSStringify(f.Payload)
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.PayloadJS, string(payload), vec.Name)

		// Ed25519 is deterministic: signing in Go yields JavaScript's signature.
		g := *f
		require.NoError(t, SignIntent(&g, priv), vec.Name)
		require.Equal(t, vec.Signature, g.Signature, vec.Name)

		// The delivered frame still verifies after a JavaScript-style re-parse.
		d, err := f.DeliveryJSON()
		require.NoError(t, err, vec.Name)
		df, err := DecodeIntentFrame(d)
		require.NoError(t, err, vec.Name)
		require.False(t, df.UsedParams, vec.Name)
		require.Equal(t, Version, df.V, vec.Name)
		require.Equal(t, string(f.Payload), string(df.Payload), vec.Name)
		require.NoError(t, df.Verify(pub), vec.Name)

		// Tampering breaks it.
		bad := *f
		bad.Nonce += "x"
		require.ErrorIs(t, bad.Verify(pub), ErrBadSignature, vec.Name)
	}
}

func TestJSVectorsResults(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	pub, err := ParsePublicKey(v.Key.PublicKeyBase64)
	require.NoError(t, err)
	priv, err := ParsePrivateKey(v.Key.PrivateKeyBase64)
	require.NoError(t, err)
	require.NotEmpty(t, v.Results)
	for _, vec := range v.Results {
		in, err := ResultSigningInput([]byte(vec.Wire))
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.SigningString, string(in), vec.Name)
		r, err := DecodeResultFrame([]byte(vec.Wire))
		if CheckNoDuplicateKeys([]byte(vec.Wire)) != nil {
			var dup *DuplicateKeyError
			require.ErrorAs(t, err, &dup, vec.Name)
			continue
		}
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.Signature, r.Signature, vec.Name)
		require.NoError(t, r.Verify(pub), vec.Name)

		signed, err := SignResult([]byte(vec.Wire), priv)
		require.NoError(t, err, vec.Name)
		r2, err := DecodeResultFrame(signed)
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.Signature, r2.Signature, vec.Name)
	}
}

func TestJSVectorsStringify(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	require.NotEmpty(t, v.Stringify)
	for _, vec := range v.Stringify {
		js, err := JSStringify([]byte(vec.Input))
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.JS, string(js), vec.Name)
		c, err := CanonicalJSON([]byte(vec.Input))
		require.NoError(t, err, vec.Name)
		require.Equal(t, vec.Canonical, string(c), vec.Name)
	}
}

// referenceFixtures is fixtures/wire/reference: the reference implementation's published fixtures,
// copied verbatim (see fixtures/wire/README.md).
func referenceFixtures(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("..", "..", "fixtures", "wire", "reference")
	_, err := os.Stat(dir)
	require.NoError(t, err, "reference fixtures")
	return dir
}

type signedFixture struct {
	Release  string `json:"release"`
	Kind     string `json:"kind"`
	SignedBy struct {
		BeamID          string `json:"beamId"`
		PublicKeyBase64 string `json:"publicKeyBase64"`
	} `json:"signedBy"`
	Frame json.RawMessage `json:"frame"`
}

func TestReferenceSignedFixtures(t *testing.T) {
	t.Parallel()
	dir := referenceFixtures(t)
	files, err := filepath.Glob(filepath.Join(dir, "releases-*.json"))
	require.NoError(t, err)
	require.Len(t, files, 4)
	for _, file := range files {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		var fx signedFixture
		require.NoError(t, json.Unmarshal(data, &fx))
		pub, err := ParsePublicKey(fx.SignedBy.PublicKeyBase64)
		require.NoError(t, err, file)
		switch fx.Kind {
		case "intent":
			f, err := DecodeIntentFrame(fx.Frame)
			require.NoError(t, err, file)
			require.Equal(t, fx.SignedBy.BeamID, f.From, file)
			// Verify at the frame's own time: the timestamp parses and the signature holds.
			at, err := ParseTimestamp(f.Timestamp)
			require.NoError(t, err, file)
			require.Equal(t, f.Timestamp, FormatTimestamp(at), file)
			require.NoError(t, f.Verify(pub), file)
			// The sorted (RFC) form must not be what was signed.
			sorted, err := CanonicalJSON(mustSigningInput(t, f))
			require.NoError(t, err)
			require.Error(t, VerifySignature(sorted, f.Signature, pub), file)
			// Extra fields survive delivery verbatim.
			d, err := f.DeliveryJSON()
			require.NoError(t, err)
			df, err := DecodeIntentFrame(d)
			require.NoError(t, err)
			require.NoError(t, df.Verify(pub), file)
			for _, extra := range []string{"relayHint", "trace_id"} {
				if x := f.Extra(extra); x != nil {
					require.Equal(t, string(x), string(df.Extra(extra)), file)
				}
			}
		case "result":
			r, err := DecodeResultFrame(fx.Frame)
			require.NoError(t, err, file)
			require.True(t, r.Success)
			require.NoError(t, r.Verify(pub), file)
			tampered := strings.Replace(string(fx.Frame), `"latency": `, `"latency": 1`, 1)
			rt, err := DecodeResultFrame([]byte(tampered))
			require.NoError(t, err)
			require.ErrorIs(t, rt.Verify(pub), ErrBadSignature, file)
		default:
			t.Fatalf("%s: unknown kind %q", file, fx.Kind)
		}
	}
}

func mustSigningInput(t *testing.T, f *IntentFrame) []byte {
	t.Helper()
	in, err := f.SigningInput()
	require.NoError(t, err)
	return in
}

// TestReferenceWorkedExample pins the exact signing string of reference §2.3 and the canonical result
// string of §2.6.
func TestReferenceWorkedExample(t *testing.T) {
	t.Parallel()
	dir := referenceFixtures(t)
	data, err := os.ReadFile(filepath.Join(dir, "releases-v0.6.0-intent-forward-compatible.json"))
	require.NoError(t, err)
	var fx signedFixture
	require.NoError(t, json.Unmarshal(data, &fx))
	f, err := DecodeIntentFrame(fx.Frame)
	require.NoError(t, err)
	const want = `{"type":"intent","from":"procurement@acme.beam.directory","to":"partner-desk@northwind.beam.directory","intent":"quote.request","payload":{"project":"Mannheim rooftop rollout","sku":"INV-240","quantity":240,"shipTo":"Mannheim, DE","neededBy":"2026-04-03","priority":"high"},"timestamp":"2026-03-30T15:00:00.000Z","nonce":"compat-release-v0-6-0-intent"}`
	require.Equal(t, want, string(mustSigningInput(t, f)))
	require.Equal(t, "wvZ2iDZZ0mIxCUVjrUvSvGOnjFTrNYZptrZsD7ZIhrKlea2Galr6o+gMGDYrgw0IkcCLkNbG6O9LUxgbNxHADQ==", f.Signature)
	pub, err := ParsePublicKey("MCowBQYDK2VwAyEAQYvLymXtml/R0LTxPO7RlIZBV/WyfVi2RowyLoNwVuw=")
	require.NoError(t, err)
	require.NoError(t, VerifySignature([]byte(want), f.Signature, pub))
	require.Equal(t, `{"route":"direct-http","expectedOrg":"northwind"}`, string(compactJSON(f.Extra("relayHint"))))

	data, err = os.ReadFile(filepath.Join(dir, "releases-v0.6.0-result-forward-compatible.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &fx))
	in, err := ResultSigningInput(fx.Frame)
	require.NoError(t, err)
	const wantResult = `{"latency":1820,"nonce":"compat-release-v0-6-0-intent","payload":{"inventory":{"available":true,"confidence":"high","shipWindow":"Thu 08:00-12:00 CET"},"quotedUnitPriceEur":184,"supplier":"partner-desk@northwind.beam.directory","totalPriceEur":44160},"success":true,"timestamp":"2026-03-30T15:00:02.000Z","traceSummary":{"retryCount":0,"stages":["received","validated","dispatched","delivered","acked"]},"v":"1"}`
	require.Equal(t, wantResult, string(in))
}

func TestReferenceAsyncAcceptance(t *testing.T) {
	t.Parallel()
	dir := referenceFixtures(t)
	data, err := os.ReadFile(filepath.Join(dir, "releases-v0.6.1-result-async-accepted.json"))
	require.NoError(t, err)
	var fx signedFixture
	require.NoError(t, json.Unmarshal(data, &fx))
	r, err := DecodeResultFrame(fx.Frame)
	require.NoError(t, err)
	require.True(t, IsAsyncAcceptance(r))
	require.NotNil(t, r.Latency)
	require.EqualValues(t, 640, *r.Latency)

	data, err = os.ReadFile(filepath.Join(dir, "releases-v0.6.0-result-forward-compatible.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &fx))
	r, err = DecodeResultFrame(fx.Frame)
	require.NoError(t, err)
	require.False(t, IsAsyncAcceptance(r))
}

// TestReferencePlaceholderFixtures treats the unsigned fixtures as parser tests: extra fields are
// ignored, params is normalized, and the frames verify once re-signed with a fresh key.
func TestReferencePlaceholderFixtures(t *testing.T) {
	t.Parallel()
	dir := referenceFixtures(t)
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	stamp := func(data []byte) []byte {
		return []byte(strings.ReplaceAll(string(data), "__NOW__", FormatTimestamp(now)))
	}

	data, err := os.ReadFile(filepath.Join(dir, "intent-forward-compatible.json"))
	require.NoError(t, err)
	f, err := DecodeIntentFrame(stamp(data))
	require.NoError(t, err)
	require.False(t, f.UsedParams)
	require.Equal(t, "compat-signature", f.Signature)
	require.ErrorIs(t, f.Verify(pub), ErrBadSignature)
	require.JSONEq(t, `{"schemaRevision":"2026-03","confidenceRequested":true}`, string(f.Extra("meta")))
	require.Equal(t, `"compat-trace-001"`, string(f.Extra("traceId")))
	require.NoError(t, SignIntent(f, priv))
	require.NoError(t, f.Verify(pub))
	d, err := f.DeliveryJSON()
	require.NoError(t, err)
	df, err := DecodeIntentFrame(d)
	require.NoError(t, err)
	require.NoError(t, df.Verify(pub))
	require.Equal(t, string(f.Extra("replyTo")), string(df.Extra("replyTo")))

	data, err = os.ReadFile(filepath.Join(dir, "intent-legacy-params.json"))
	require.NoError(t, err)
	f, err = DecodeIntentFrame(stamp(data))
	require.NoError(t, err)
	require.True(t, f.UsedParams)
	require.JSONEq(t, `{"sku":"INV-240","quantity":240,"shipTo":"Mannheim, DE"}`, string(f.Payload))
	require.NoError(t, SignIntent(f, priv))
	d, err = f.DeliveryJSON()
	require.NoError(t, err)
	require.NotContains(t, string(d), `"params"`)
	require.Contains(t, string(d), `"extensions"`)
	df, err = DecodeIntentFrame(d)
	require.NoError(t, err)
	require.False(t, df.UsedParams)
	require.Equal(t, string(f.Payload), string(df.Payload))
	require.NoError(t, df.Verify(pub))

	data, err = os.ReadFile(filepath.Join(dir, "result-forward-compatible.json"))
	require.NoError(t, err)
	r, err := DecodeResultFrame(stamp(data))
	require.NoError(t, err)
	require.True(t, r.Success)
	require.EqualValues(t, 1840, *r.Latency)
	require.ErrorIs(t, r.Verify(pub), ErrBadSignature)
	signed, err := SignResult(r.Raw, priv)
	require.NoError(t, err)
	r, err = DecodeResultFrame(signed)
	require.NoError(t, err)
	require.NoError(t, r.Verify(pub))
	// The additive fields are covered by the signature.
	tampered := strings.Replace(string(signed), `"status":"acked"`, `"status":"failed"`, 1)
	require.NotEqual(t, string(signed), tampered)
	rt, err := DecodeResultFrame([]byte(tampered))
	require.NoError(t, err)
	require.ErrorIs(t, rt.Verify(pub), ErrBadSignature)
}
