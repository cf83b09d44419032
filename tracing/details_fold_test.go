package tracing

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// foldView is what decodeFold promises to decode like decodeKnown.
func foldView(d Details) Details {
	d.Frame, d.Retryable, d.LegacyStage, d.LegacyStatus = nil, false, "", ""
	return d
}

// requireFoldDecodes checks that decodeFold agrees with decodeKnown on in:
// the same error outcome and the same fields.
func requireFoldDecodes(t *testing.T, in []byte) {
	t.Helper()
	var want, got Details
	werr := want.decodeKnown(in)
	gerr := got.decodeFold(in)
	if werr != nil {
		require.Error(t, gerr, "%s", in)
		return
	}
	require.NoError(t, gerr, "%s", in)
	require.Equal(t, foldView(want), got, "%s", in)
}

func TestDecodeFoldMatchesDecodeKnown(t *testing.T) {
	t.Parallel()
	lat, rc := int64(7), 2
	full := Details{
		Owner: OwnerBus, Frame: json.RawMessage(`{"nonce":"x","p":[1,2.5e3,true,null,{"a":"\u00e9"}]}`),
		ClientTimestamp: "2026-01-01T00:00:00Z", TimeoutMs: 30000, ErrorCode: "TIMEOUT",
		Error: "line\n\"quoted\"\t\\ / \x01 é", Retryable: true, LatencyMs: &lat,
		Result: json.RawMessage(`{"ok":true}`), NextRetryAt: 1767225600000, RetryCount: &rc,
		LeaseOwner: "worker-1", LeaseExpiresAt: -5, Response: json.RawMessage(`"done"`),
		LegacyStage: "s", LegacyStatus: "t",
		Bus: &BusMessage{MessageID: "m-1", Payload: json.RawMessage(`[1,{"b":null}]`), Priority: 2,
			MaxRetries: 9, TraceID: "tr", Metadata: json.RawMessage(`{"k":"v"}`)},
		Extra: map[string]any{"peer": "p", "hops": 3, "nested": map[string]any{"x": []any{1, "y"}}},
	}
	enc, err := full.MarshalJSON()
	require.NoError(t, err)
	var got Details
	require.NoError(t, got.decodeFold(enc))
	want := foldView(full)
	want.Extra = nil
	require.Equal(t, want, got)

	for _, s := range []string{
		string(enc), `{}`, ``, `  { "owner" : "bus" , "timeoutMs" : 5 }  `, `{"owner":"bus"}x`, `{"owner":"bus",}`,
		`{"Owner":"x"}`, `{"owner":"a","owner":"b"}`, `{"latencyMs":null}`, `{"result":null}`, `{"timeoutMs":1.5}`,
		`{"timeoutMs":1e3}`, `{"timeoutMs":99999999999999999999}`, `{"retryCount":"1"}`, `{"error":"\u00e9"}`,
		`{"error":"\ud800"}`, `{"error":"a\qb"}`, "{\"error\":\"\xff\"}", "{\"x\":\"\xff\"}", `{"x":01}`, `{"x":-}`,
		`{"x":[1,]}`, `{"x":tru}`, `{"retryable":1}`, `{"legacyStage":3}`, `{"frame":}`, `{"bus":null}`,
		`{"bus":{"messageId":"m","MESSAGEID":"n"}}`, `{"bus":{"messageId":"m","other":[{}]},"bus":{}}`,
		`{"bus":{"priority":1.0}}`, `{"k\u0065y":1}`, `{"ſtate":1}`, `[]`, `null`, `{"a":1`, `{"a" 1}`,
		`{"response":"x","response":"y"}`, `{"nextRetryAt":-0}`,
	} {
		requireFoldDecodes(t, []byte(s))
	}
}

// FuzzDecodeFold checks that the fast decoder agrees with encoding/json.
func FuzzDecodeFold(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"owner":"bus","frame":{"a":1},"extra":[1,2.5,"x"]}`, `{"latencyMs":null,"bus":{"messageId":"m"}}`,
		`{"Owner":"x","owner":"y"}`, `{"result":"\u00e9\ud83d\ude00","k":1e300}`, `{"retryCount":-1,"nextRetryAt":9007199254740993}`,
		`{"error":"a\n\"b\"","leaseOwner":"w","leaseExpiresAt":12}`, `{"bus":{"payload":  [ 1 , 2 ] ,"priority":3}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		requireFoldDecodes(t, in)
	})
}
