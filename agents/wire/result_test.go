package wire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var resultNow = time.Date(2026, 3, 30, 15, 0, 2, 0, time.UTC)

func TestDecodeResultFrame(t *testing.T) {
	t.Parallel()
	r, err := DecodeResultFrame([]byte(`{"v":"1","success":false,"nonce":"n","timestamp":"ts","error":"e","errorCode":"OFFLINE","latency":12.6,"payload":null,"extra":1}`))
	require.NoError(t, err)
	require.False(t, r.Success)
	require.Equal(t, "n", r.Nonce)
	require.Equal(t, "e", r.Error)
	require.Equal(t, "OFFLINE", r.ErrorCode)
	require.EqualValues(t, 13, *r.Latency)
	require.Nil(t, r.Payload)
	require.Equal(t, "", r.Signature)

	bad := []string{
		`[]`, `{`, `{"success":"yes","nonce":"n","timestamp":"t"}`, `{"nonce":"n","timestamp":"t"}`,
		`{"success":true,"nonce":"","timestamp":"t"}`, `{"success":true,"nonce":"n"}`,
		`{"success":true,"nonce":"n","timestamp":"t","error":5}`, `{"success":true,"nonce":"n","timestamp":"t","latency":"5"}`,
		`{"success":true,"nonce":"n","timestamp":"t","latency":1e300}`, `{"success":true,"nonce":"n","timestamp":"t","signature":[]}`,
	}
	for _, in := range bad {
		_, err := DecodeResultFrame([]byte(in))
		var fe *FrameError
		require.True(t, errors.As(err, &fe), in)
		require.Equal(t, CodeInvalidResult, fe.Code, in)
	}
}

func TestResultBuildSignVerify(t *testing.T) {
	t.Parallel()
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	lat := int64(42)
	frame, err := Result{
		Success: true,
		Nonce:   "n-1",
		Payload: json.RawMessage(`{"b": 1, "a": "ü", "10": 1.0}`),
		Latency: &lat,
	}.Build(resultNow, priv)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(frame), `{"v":"1","success":true,"nonce":"n-1","timestamp":"2026-03-30T15:00:02.000Z","payload":{"10":1,"b":1,"a":"ü"},"latency":42,"signature":"`), string(frame))
	r, err := DecodeResultFrame(frame)
	require.NoError(t, err)
	require.NoError(t, r.Verify(pub))
	in, err := ResultSigningInput(frame)
	require.NoError(t, err)
	require.Equal(t, `{"latency":42,"nonce":"n-1","payload":{"10":1,"a":"ü","b":1},"success":true,"timestamp":"2026-03-30T15:00:02.000Z","v":"1"}`, string(in))

	// Re-signing replaces the old signature; unknown fields are covered.
	extra := strings.Replace(string(frame), `"latency":42`, `"latency":42,"traceId":"t"`, 1)
	signed, err := SignResult([]byte(extra), priv)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(signed), `"signature"`))
	r, err = DecodeResultFrame(signed)
	require.NoError(t, err)
	require.NoError(t, r.Verify(pub))
	r, err = DecodeResultFrame([]byte(strings.Replace(string(signed), `"traceId":"t"`, `"traceId":"u"`, 1)))
	require.NoError(t, err)
	require.ErrorIs(t, r.Verify(pub), ErrBadSignature)

	// Unsigned build.
	unsigned, err := Result{Success: false, Nonce: "n", Error: "boom", ErrorCode: "INTENT_HANDLER_ERROR"}.Build(resultNow, nil)
	require.NoError(t, err)
	require.Equal(t, `{"v":"1","success":false,"nonce":"n","timestamp":"2026-03-30T15:00:02.000Z","error":"boom","errorCode":"INTENT_HANDLER_ERROR"}`, string(unsigned))
	r, err = DecodeResultFrame(unsigned)
	require.NoError(t, err)
	require.ErrorIs(t, r.Verify(pub), ErrBadSignature)

	_, err = Result{Nonce: "n", Payload: json.RawMessage(`[1]`)}.Build(resultNow, nil)
	require.Error(t, err)
	_, err = Result{}.Build(resultNow, nil)
	require.Error(t, err)
	_, err = SignResult([]byte(`{"__proto__":{}}`), priv)
	require.Error(t, err)
	signed, err = SignResult([]byte(`{"signature":"old"}`), priv)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(signed), `{"signature":"`))
}

func TestFailureResult(t *testing.T) {
	t.Parallel()
	lat := int64(30000)
	b := FailureResult("n\"1", "TIMEOUT", "Intent timed out\n", resultNow, &lat)
	require.Equal(t, `{"v":"1","success":false,"nonce":"n\"1","timestamp":"2026-03-30T15:00:02.000Z","error":"Intent timed out\n","errorCode":"TIMEOUT","latency":30000}`, string(b))
	r, err := DecodeResultFrame(b)
	require.NoError(t, err)
	require.Equal(t, "TIMEOUT", r.ErrorCode)
	require.False(t, IsAsyncAcceptance(r))
	b = FailureResult("n", "OFFLINE", "bad \xff utf8", resultNow, nil)
	require.True(t, json.Valid(b))
	require.NotContains(t, string(b), "latency")
	_, err = DecodeResultFrame(b)
	require.NoError(t, err)
}

func TestIsAsyncAcceptance(t *testing.T) {
	t.Parallel()
	mk := func(s string) *ResultFrame {
		r, err := DecodeResultFrame([]byte(s))
		require.NoError(t, err)
		return r
	}
	require.True(t, IsAsyncAcceptance(mk(`{"success":true,"nonce":"n","timestamp":"t","payload":{"terminal":false}}`)))
	require.False(t, IsAsyncAcceptance(mk(`{"success":true,"nonce":"n","timestamp":"t","payload":{"terminal":true}}`)))
	require.False(t, IsAsyncAcceptance(mk(`{"success":true,"nonce":"n","timestamp":"t","payload":{"terminal":"false"}}`)))
	require.False(t, IsAsyncAcceptance(mk(`{"success":false,"nonce":"n","timestamp":"t","payload":{"terminal":false}}`)))
	require.False(t, IsAsyncAcceptance(mk(`{"success":true,"nonce":"n","timestamp":"t"}`)))
	require.False(t, IsAsyncAcceptance(nil))
}

func TestSignVerifyCanonical(t *testing.T) {
	t.Parallel()
	pub, priv, err := GenerateKey()
	require.NoError(t, err)
	fields := map[string]any{
		"action":       "keys.rotate",
		"beamId":       "a@acme.beam.directory",
		"newPublicKey": EncodePublicKey(pub),
		"timestamp":    "2026-03-30T15:00:00.000Z",
		"nonce":        "n<&>",
	}
	sig, err := SignCanonical(fields, priv)
	require.NoError(t, err)
	// Any key order and formatting of the same fields verifies.
	raw := []byte(`{"timestamp":"2026-03-30T15:00:00.000Z","nonce":"n<&>","newPublicKey":"` + EncodePublicKey(pub) + `","beamId":"a@acme.beam.directory","action":"keys.rotate"}`)
	require.NoError(t, VerifyCanonical(raw, sig, pub))
	sig2, err := SignCanonical(raw, priv)
	require.NoError(t, err)
	require.Equal(t, sig, sig2)
	require.ErrorIs(t, VerifyCanonical([]byte(strings.Replace(string(raw), "keys.rotate", "keys.revoke", 1)), sig, pub), ErrBadSignature)
	require.ErrorIs(t, VerifyCanonical([]byte(`{`), sig, pub), ErrBadSignature)
	_, err = SignCanonical("{}", priv)
	require.Error(t, err)
	_, err = SignCanonical(map[string]any{"a": 1}, priv[:5])
	require.Error(t, err)
}

func FuzzDecodeResultFrame(f *testing.F) {
	f.Add([]byte(`{"v":"1","success":true,"nonce":"n","timestamp":"t","payload":{"terminal":false},"latency":1}`))
	f.Add([]byte(`{"success":false,"nonce":"n","timestamp":"t","error":"e","errorCode":"X","signature":"abc"}`))
	f.Add([]byte(`{"success":true,"nonce":"n","timestamp":"t","latency":-0.5,"payload":[1,{"2":3}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResultFrame(data)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("error is not a *FrameError: %v", err)
			}
			return
		}
		if r.Nonce == "" || string(r.Raw) != string(data) {
			t.Fatalf("bad decode of %q", data)
		}
		_ = IsAsyncAcceptance(r)
		_, _ = ResultSigningInput(r.Raw)
	})
}
