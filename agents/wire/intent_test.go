package wire

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const testFrame = `{"v":"1","intent":"agent.ping","from":"a@acme.beam.directory","to":"b@beam.directory","payload":{"b":1,"2":"x","a":{"ü":1.0}},"nonce":"n-1","timestamp":"2026-03-30T15:00:00.000Z"}`

type intentBundle struct {
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
}

func setupIntent(t *testing.T) *intentBundle {
	t.Helper()
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	return &intentBundle{pub: pub, priv: priv}
}

func TestDecodeIntentFrameShape(t *testing.T) {
	t.Parallel()
	f, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)
	require.Equal(t, "1", f.V)
	require.Equal(t, "agent.ping", f.Intent)
	require.Equal(t, "a@acme.beam.directory", f.From)
	require.Equal(t, "b@beam.directory", f.To)
	require.Equal(t, `{"b":1,"2":"x","a":{"ü":1.0}}`, string(f.Payload))
	require.Equal(t, "n-1", f.Nonce)
	require.Equal(t, "", f.Signature)
	require.Equal(t, testFrame, string(f.Raw))

	in, err := f.SigningInput()
	require.NoError(t, err)
	require.Equal(t, `{"type":"intent","from":"a@acme.beam.directory","to":"b@beam.directory","intent":"agent.ping","payload":{"2":"x","b":1,"a":{"ü":1}},"timestamp":"2026-03-30T15:00:00.000Z","nonce":"n-1"}`, string(in))

	bad := map[string]string{
		"not json":          `{`,
		"not object":        `[]`,
		"from number":       strings.Replace(testFrame, `"from":"a@acme.beam.directory"`, `"from":1`, 1),
		"to missing":        strings.Replace(testFrame, `"to":"b@beam.directory",`, ``, 1),
		"intent null":       strings.Replace(testFrame, `"intent":"agent.ping"`, `"intent":null`, 1),
		"payload array":     strings.Replace(testFrame, `"payload":{"b":1,"2":"x","a":{"ü":1.0}}`, `"payload":[]`, 1),
		"payload missing":   strings.Replace(testFrame, `"payload":{"b":1,"2":"x","a":{"ü":1.0}},`, ``, 1),
		"nonce empty":       strings.Replace(testFrame, `"nonce":"n-1"`, `"nonce":""`, 1),
		"timestamp number":  strings.Replace(testFrame, `"timestamp":"2026-03-30T15:00:00.000Z"`, `"timestamp":5`, 1),
		"signature empty":   testFrame[:len(testFrame)-1] + `,"signature":""}`,
		"signature number":  testFrame[:len(testFrame)-1] + `,"signature":7}`,
		"lone surrogate":    strings.Replace(testFrame, `"nonce":"n-1"`, `"nonce":"\ud800"`, 1),
		"invalid utf8":      strings.Replace(testFrame, `n-1`, "n\xff1", 1),
		"trailing garbage":  testFrame + "x",
		"too large":         `{"x":"` + strings.Repeat("a", MaxFrameBytes) + `"}`,
		"signature is null": testFrame[:len(testFrame)-1] + `,"signature":null}`,
	}
	for name, in := range bad {
		_, err := DecodeIntentFrame([]byte(in))
		var fe *FrameError
		require.True(t, errors.As(err, &fe), "%s: %v", name, err)
		require.Equal(t, CodeInvalidIntent, fe.Code, name)
	}
}

func TestDecodeIntentFrameParamsAndDuplicates(t *testing.T) {
	t.Parallel()
	// payload that is not an object falls back to params, like the JavaScript SDK does.
	in := `{"from":"a@beam.directory","to":"b@beam.directory","intent":"x","payload":null,"params":{"k":1},"nonce":"n","timestamp":"t","extra":[1, 2]}`
	f, err := DecodeIntentFrame([]byte(in))
	require.NoError(t, err)
	require.True(t, f.UsedParams)
	require.Equal(t, `{"k":1}`, string(f.Payload))
	d, err := f.DeliveryJSON()
	require.NoError(t, err)
	require.Equal(t, `{"v":"1","from":"a@beam.directory","to":"b@beam.directory","intent":"x","payload":{"k":1},"nonce":"n","timestamp":"t","extra":[1, 2]}`, string(d))

	// Duplicate keys, at the top level or inside the payload, are refused:
	// JSON.parse keeps the last value and other parsers the first, so the
	// signer and a recipient could read different frames.
	for _, in := range []string{
		`{"nonce":"first","from":"a@beam.directory","to":"b@beam.directory","intent":"x","payload":{},"timestamp":"t","nonce":"second"}`,
		`{"nonce":"n","from":"a@beam.directory","to":"b@beam.directory","intent":"x","payload":{"a":{"amount":1,"amount":1000}},"timestamp":"t"}`,
	} {
		_, err = DecodeIntentFrame([]byte(in))
		var dup *DuplicateKeyError
		require.ErrorAs(t, err, &dup)
		var fe *FrameError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, CodeInvalidIntent, fe.Code)
	}
}

func TestDecodeIntentFrameFieldLengths(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 300)
	for field, in := range map[string]string{
		"intent": `{"from":"a@beam.directory","to":"b@beam.directory","intent":"","payload":{},"nonce":"n","timestamp":"t"}`,
		"to":     `{"from":"a@beam.directory","to":"","intent":"x","payload":{},"nonce":"n","timestamp":"t"}`,
		"nonce":  `{"from":"a@beam.directory","to":"b@beam.directory","intent":"x","payload":{},"nonce":"` + long + `","timestamp":"t"}`,
		"from":   `{"from":"` + long + `","to":"b@beam.directory","intent":"x","payload":{},"nonce":"n","timestamp":"t"}`,
	} {
		_, err := DecodeIntentFrame([]byte(in))
		var fe *FrameError
		require.ErrorAs(t, err, &fe, field)
		require.Equal(t, field, fe.Field)
	}
}

func TestSignVerifyIntent(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	f, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)
	require.ErrorIs(t, f.Verify(b.pub), ErrBadSignature) // unsigned
	require.NoError(t, SignIntent(f, b.priv))
	require.Len(t, f.Signature, 88)
	require.NoError(t, f.Verify(b.pub))

	other, _, err := GenerateKey()
	require.NoError(t, err)
	require.ErrorIs(t, f.Verify(other), ErrBadSignature)

	for _, mutate := range []func(*IntentFrame){
		func(g *IntentFrame) { g.From = "x@beam.directory" },
		func(g *IntentFrame) { g.To = "x@beam.directory" },
		func(g *IntentFrame) { g.Intent = "other" },
		func(g *IntentFrame) { g.Timestamp = "2026-03-30T15:00:00.001Z" },
		func(g *IntentFrame) { g.Payload = json.RawMessage(`{"b":2,"2":"x","a":{"ü":1}}`) },
		func(g *IntentFrame) { g.Signature = g.Signature[:10] },
	} {
		g := *f
		mutate(&g)
		require.ErrorIs(t, g.Verify(b.pub), ErrBadSignature)
	}
	// v, extra fields and payload formatting are not signed.
	g := *f
	g.V = "2"
	g.Payload = json.RawMessage(`{ "b" : 1, "2":"x", "a":{"\u00fc":1e0}, "b":1 }`)
	require.NoError(t, g.Verify(b.pub))
}

func TestVerifyAlternativeForms(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	f, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)

	// (b) signed over the compacted wire bytes (no JS re-ordering, 1.0 kept).
	compact := f.appendEnvelope(nil, appendJSString, compactJSON(f.Payload))
	require.Contains(t, string(compact), `"payload":{"b":1,"2":"x","a":{"ü":1.0}}`)
	f.Signature = Sign(compact, b.priv)
	require.NoError(t, f.Verify(b.pub))

	// (c) Python-style: ensure_ascii escapes, wire order, wire number text.
	python := `{"type":"intent","from":"a@acme.beam.directory","to":"b@beam.directory","intent":"agent.ping","payload":{"b":1,"2":"x","a":{"\u00fc":1.0}},"timestamp":"2026-03-30T15:00:00.000Z","nonce":"n-1"}`
	f.Signature = Sign([]byte(python), b.priv)
	require.NoError(t, f.Verify(b.pub))

	// Something else entirely does not verify.
	f.Signature = Sign([]byte(`{"type":"intent"}`), b.priv)
	require.ErrorIs(t, f.Verify(b.pub), ErrBadSignature)
}

func TestASCIIStringLikePython(t *testing.T) {
	t.Parallel()
	// Expected values as Python's json.dumps(s) (ensure_ascii=True) writes them.
	cases := map[string]string{
		"ü":          `"\u00fc"`,
		"😀":          `"\ud83d\ude00"`,
		"\x7f":       `"\u007f"`,
		"a\"b\\c":    `"a\"b\\c"`,
		"\n\r\t\b\f": `"\n\r\t\b\f"`,
		"\x01":       `"\u0001"`,
		"\u2028":     `"\u2028"`,
		"plain ~":    `"plain ~"`,
	}
	for in, want := range cases {
		require.Equal(t, want, string(appendASCIIString(nil, in)), "%q", in)
	}
	require.Equal(t, `"\ud800"`, string(appendASCIIString(nil, string(appendSurrogate(nil, 0xD800)))))
}

func TestNewIntentFrame(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	now := time.Date(2026, 3, 30, 17, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	f := NewIntentFrame("a@beam.directory", "b@acme.beam.directory", "agent.ping", nil, now)
	require.Equal(t, "2026-03-30T15:00:00.123Z", f.Timestamp)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), f.Nonce)
	require.NotEqual(t, f.Nonce, NewIntentFrame("a", "b", "c", nil, now).Nonce)
	require.Equal(t, `{}`, string(f.Payload))
	require.NoError(t, SignIntent(f, b.priv))
	d, err := f.DeliveryJSON()
	require.NoError(t, err)
	require.Equal(t, `{"v":"1","intent":"agent.ping","from":"a@beam.directory","to":"b@acme.beam.directory","payload":{},"nonce":"`+f.Nonce+`","timestamp":"2026-03-30T15:00:00.123Z","signature":"`+f.Signature+`"}`, string(d))
	g, err := DecodeIntentFrame(d)
	require.NoError(t, err)
	require.NoError(t, g.Verify(b.pub))
	size, err := f.DeliverySize()
	require.NoError(t, err)
	require.Equal(t, len(d), size)
}

func TestDeliveryKeepsPayloadBytesAndExtras(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	in := "{\n \"meta\" : {\"z\":1, \"a\":[1.0]},\n \"from\":\"a@beam.directory\",\"to\":\"b@beam.directory\",\"intent\":\"x\",\n \"payload\": {\"z\": 1.50, \"10\": \"\\u00fc\", \"2\": 2},\"nonce\":\"n\",\"timestamp\":\"t\",\"v\":\"0\"}"
	f, err := DecodeIntentFrame([]byte(in))
	require.NoError(t, err)
	require.NoError(t, SignIntent(f, b.priv))
	d, err := f.DeliveryJSON()
	require.NoError(t, err)
	require.Equal(t, `{"meta":{"z":1, "a":[1.0]},"from":"a@beam.directory","to":"b@beam.directory","intent":"x","payload":{"z": 1.50, "10": "\u00fc", "2": 2},"nonce":"n","timestamp":"t","v":"1","signature":"`+f.Signature+`"}`, string(d))
	size, err := f.DeliverySize()
	require.NoError(t, err)
	js, err := JSStringify(d)
	require.NoError(t, err)
	require.Equal(t, len(js), size)
	require.Less(t, size, len(d)) // JS drops the whitespace and the escape
}

func TestDeliverySizeLimit(t *testing.T) {
	t.Parallel()
	b := setupIntent(t)
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	big := NewIntentFrame("a@beam.directory", "b@beam.directory", "x", json.RawMessage(`{"blob":"`+strings.Repeat("ü", 2100)+`"}`), now)
	require.NoError(t, SignIntent(big, b.priv))
	size, err := big.DeliverySize()
	require.NoError(t, err)
	require.Greater(t, size, MaxDeliverySize) // 4200 bytes of ü alone
}
