package directory

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

// decodeWSMessageJSON is the encoding/json decoder scanWSMessage replaced,
// kept as the reference its behaviour is compared with.
func decodeWSMessageJSON(data []byte) (wsMessage, error) {
	var m struct {
		Type  json.RawMessage `json:"type"`
		Frame json.RawMessage `json:"frame"`
		JWS   json.RawMessage `json:"jws"`
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return wsMessage{}, errInvalidMessage
	}
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return wsMessage{}, errInvalidMessage
	}
	var out wsMessage
	_ = json.Unmarshal(m.Type, &out.Type)
	_ = json.Unmarshal(m.JWS, &out.JWS)
	if len(m.Frame) > 0 && string(m.Frame) != "null" {
		out.Frame = m.Frame
	}
	return out, nil
}

// benchIntentMessage is an intent message shaped like the ones beam bench
// sends (signed frame, 64-byte filler payload).
func benchIntentMessage(t testing.TB) []byte {
	_, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	payload := json.RawMessage(`{"task":"bench","fill":"` + strings.Repeat("x", 64) + `"}`)
	f := wire.NewIntentFrame("bench-a-12@alpha.beam.directory", "bench-b-12@alpha.beam.directory", "bench.echo", payload,
		time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC))
	require.NoError(t, wire.SignIntent(f, priv))
	b, err := f.DeliveryJSON()
	require.NoError(t, err)
	return []byte(`{"type":"intent","frame":` + string(b) + `}`)
}

// benchResultMessage is a signed result message like a bench recipient's.
func benchResultMessage(t testing.TB) []byte {
	_, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	lat := int64(3)
	res, err := wire.Result{Success: true, Nonce: wire.NewNonce(), Payload: json.RawMessage(`{"ok":true}`), Latency: &lat}.
		Build(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ed25519.PrivateKey(priv))
	require.NoError(t, err)
	return []byte(`{"type":"result","frame":` + string(res) + `}`)
}

// envelopeSeeds are messages the fuzzer starts from and the table test
// checks: real messages, nulls, duplicates, escapes, case-folded keys,
// invalid JSON in every member, invalid UTF-8 and deep nesting.
func envelopeSeeds(t testing.TB) []string {
	intent, result := string(benchIntentMessage(t)), string(benchResultMessage(t))
	frame := intent[len(`{"type":"intent","frame":`) : len(intent)-1]
	deep := func(n int, open, closeWith string) string {
		return strings.Repeat(open, n) + strings.Repeat(closeWith, n)
	}
	return []string{
		intent, result,
		strings.Replace(intent, `"frame":{`, `"frame": {"junk":[1,2,{"a":"\"}]"}],`, 1),
		intent[:len(intent)-1] + `,"frame":null}`,
		intent[:len(intent)-1] + `,"frame":` + frame + `}`,
		intent[:len(intent)-1] + `,"frame":{"x":}}`,
		intent[:len(intent)-1] + `,"frame":{"x":1]}`,
		`{"frame":{"x":}` + `,"frame":{}}`,
		`{"frame":{"a":1},"frame":{"b":[}}`,
		`{"type":"intent","frame":{"v":"1","intent":"a.b","from":"a@x.beam.directory","to":"b@x.beam.directory","payload":{},"nonce":"n","timestamp":"2026-01-01T00:00:00.000Z","signature":"c2ln"}}`,
		`{"type":"intent","jws":"eyJhbGciOiJFZERTQSJ9.eyJ2IjoiMiJ9.c2ln"}`,
		`{"type":"result","jws":"a.b.c","frame":{"broken":}}`,
		`{"type":"result","jws":"a.b.c","frame":{"ok":[1,{"x":null}]}}`,
		`{"type":"result","frame":null}`, `{"type":"intent"}`, `{"type":"intent","frame":null}`,
		`{"type":"result","frame":{"v":"1","success":true,"nonce":"n","timestamp":"t","payload":{"terminal":false}}}`,
		`{"type":7}`, `{"type":null}`, `{"type":["intent"]}`, `{"type":{"a":"intent"}}`, `{"jws":5,"type":"intent"}`,
		`{"type":"intent","frame":"x"}`, `{"type":"intent","frame":12.5e-3}`, `{"type":"intent","frame":[1,2]}`,
		`{"type":"intent","frame":[1,2}`, `{"type":"intent","frame":{"a":"\"}"}}`, `{"type":"intent","frame":{"a":"\\"}}`,
		`{"type":"intent","frame":{"a":"\\\"}"}}`,
		`[]`, `null`, `"x"`, ``, ` `, `{`, `}`, `{}`, ` {} `, "\v{}\f", "\u00a0{\"type\":\"ping\"}\u2028", "{}\x00",
		` {"type":"ping"}`, `{"TYPE":"intent"}`, `{"Frame":{},"tYpE":"result"}`, `{"jwſ":"x","type":"intent"}`,
		`{"\u0074ype":"intent"}`, `{"typ\u0065":"result","fr\u0061me":{}}`, `{"type\u0000":"intent"}`, `{"typé":"intent"}`,
		`{"type":"intent","type":"result"}`, `{"type":"intent","type":null}`, `{"type":"intent","TYPE":"result"}`,
		`{"type":"in\u0074ent"}`, `{"type":"\ud800"}`, `{"type":"\ud83d\ude00"}`, "{\"type\":\"\xff\xfe\"}", "{\"type\":\"a\tb\"}",
		"{\"type\":\"intent\",\"frame\":{\"a\":\"\xc3\x28\"}}", `{"type":"intent","frame":{"a":"\x"}}`, `{"type":"\u12"}`,
		`{"type":"intent",}`, `{,"type":"intent"}`, `{"type" "intent"}`, `{"type":"intent"} x`, `{"type":"intent"}}`,
		`{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":-0.0e+5}`, `{"a":tru}`, `{"a":nul}`, `{"a":[1,]}`, `{"a":{"b"}}`,
		`{"type":"intent","frame":{"payload":{"__proto__":1},"nonce":{"a":1}}}`,
		`{"type":"intent","frame":` + deep(600, `{"a":`, "}") + `}`,
		`{"frame":` + deep(200, "[", "") + `}`,
		`{"frame":[` + strings.Repeat(`"\\\"",`, 50) + `0]}`,
	}
}

// bigEnvelopeSeeds are the large seeds, kept out of the fuzz corpus (the
// mutator would spend its time on them): nesting at encoding/json's limit
// and a long jws.
func bigEnvelopeSeeds() []string {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	return []string{
		`{"x":` + deep(maxMessageDepth-1) + `}`,
		`{"x":` + deep(maxMessageDepth) + `}`,
		`{"frame":` + deep(maxMessageDepth-1) + `}`,
		`{"frame":` + deep(maxMessageDepth) + `}`,
		`{"type":"intent","frame":{"a":` + deep(maxMessageDepth-2) + `}}`,
		`{"type":"intent","frame":{"a":` + deep(maxMessageDepth-1) + `}}`,
		`{"frame":` + strings.Repeat("[", maxMessageDepth+5) + `}`,
		`{"jws":"` + strings.Repeat("A", 1<<16) + `","type":"result"}`,
	}
}

// requireSameDecode checks decodeWSMessage against the reference, and the
// frame decoders' path (decodeEnvelopeFrame on a skipped frame) against
// decoding the reference's frame.
func requireSameDecode(t *testing.T, data []byte) {
	t.Helper()
	want, wantErr := decodeWSMessageJSON(data)
	got, gotErr := decodeWSMessage(data)
	require.Equal(t, wantErr, gotErr, "message %q", data)
	require.Equal(t, want.Type, got.Type, "message %q", data)
	require.Equal(t, want.JWS, got.JWS, "message %q", data)
	require.Equal(t, want.Frame == nil, got.Frame == nil, "message %q", data)
	require.True(t, bytes.Equal(want.Frame, got.Frame), "message %q", data)

	env, err := scanWSMessage(data)
	if err != nil {
		require.Equal(t, errInvalidMessage, wantErr, "message %q", data)
		return
	}
	if !framedMessage(&env) {
		require.Equal(t, wantErr, env.validateFrame(), "message %q", data)
		return
	}
	// The handlers' path: the frame decoder runs on a possibly skipped
	// frame; a message the reference rejects must be errInvalidMessage
	// there, any other outcome must be the reference frame's.
	sameFrameDecode(t, data, env, wantErr, want, wire.DecodeIntentFrame)
	sameFrameDecode(t, data, env, wantErr, want, wire.DecodeResultFrame)
}

func sameFrameDecode[T any](t *testing.T, data []byte, env wsEnvelope, wantErr error, want wsMessage, decode func([]byte) (T, error)) {
	t.Helper()
	_, err := decodeEnvelopeFrame(&env, decode)
	if wantErr != nil {
		require.ErrorIs(t, err, errInvalidMessage, "message %q", data)
		return
	}
	require.False(t, env.frameSkipped, "message %q", data)
	_, refErr := decode(want.Frame)
	if refErr == nil {
		require.NoError(t, err, "message %q", data)
		return
	}
	require.Error(t, err, "message %q", data)
	require.False(t, errors.Is(err, errInvalidMessage), "message %q", data)
	require.Equal(t, refErr.Error(), err.Error(), "message %q", data)
}

func TestDecodeWSMessageMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range append(envelopeSeeds(t), bigEnvelopeSeeds()...) {
		requireSameDecode(t, []byte(s))
	}
}

func TestScanWSMessage(t *testing.T) {
	t.Parallel()
	msg := benchIntentMessage(t)
	env, err := scanWSMessage(msg)
	require.NoError(t, err)
	require.Equal(t, "intent", env.Type)
	require.True(t, env.frameSkipped, "an object frame is skipped, not validated")
	f, err := decodeEnvelopeFrame(&env, wire.DecodeIntentFrame)
	require.NoError(t, err)
	require.Equal(t, "bench.echo", f.Intent)

	// An invalid frame is found out when its decoder fails.
	env, err = scanWSMessage([]byte(`{"type":"intent","frame":{"nonce":"n",]}`))
	require.NoError(t, err)
	_, err = decodeEnvelopeFrame(&env, wire.DecodeIntentFrame)
	require.ErrorIs(t, err, errInvalidMessage)

	// A valid frame that does not decode keeps its decoder's error.
	env, err = scanWSMessage([]byte(`{"type":"intent","frame":{"nonce":"n"}}`))
	require.NoError(t, err)
	_, err = decodeEnvelopeFrame(&env, wire.DecodeIntentFrame)
	var fe *wire.FrameError
	require.ErrorAs(t, err, &fe)

	// Nesting: encoding/json's limit counts the top-level object.
	for _, tc := range []struct {
		key   string
		depth int
		ok    bool
	}{{"x", maxMessageDepth - 1, true}, {"x", maxMessageDepth, false}, {"frame", maxMessageDepth - 1, true}, {"frame", maxMessageDepth, false}} {
		m := `{"` + tc.key + `":` + strings.Repeat("[", tc.depth) + strings.Repeat("]", tc.depth) + `}`
		_, err := decodeWSMessage([]byte(m))
		if tc.ok {
			require.NoError(t, err, "%s nested %d", tc.key, tc.depth)
		} else {
			require.ErrorIs(t, err, errInvalidMessage, "%s nested %d", tc.key, tc.depth)
		}
	}
}

// FuzzDecodeWSMessageDiff compares the one-pass decoder with the
// encoding/json one it replaced on arbitrary messages. Run it longer with
// go test -run '^$' -fuzz FuzzDecodeWSMessageDiff -fuzztime 60s ./directory/
func FuzzDecodeWSMessageDiff(f *testing.F) {
	for _, s := range envelopeSeeds(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		requireSameDecode(t, data)
	})
}

func BenchmarkDecodeWSMessage(b *testing.B) {
	msg := benchIntentMessage(b)
	b.Logf("intent message: %d bytes", len(msg))
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			if _, err := decodeWSMessageJSON(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			if _, err := scanWSMessage(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan-validated", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			if _, err := decodeWSMessage(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What the server does per intent, before and after: the message
	// decode plus the frame decode.
	b.Run("with-frame/encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := decodeWSMessageJSON(msg)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := wire.DecodeIntentFrame(m.Frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("with-frame/scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			env, err := scanWSMessage(msg)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := decodeEnvelopeFrame(&env, wire.DecodeIntentFrame); err != nil {
				b.Fatal(err)
			}
		}
	})
}
