package tracing

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDetailsJSONFlatWithExtra(t *testing.T) {
	t.Parallel()
	lat := int64(42)
	rc := 0
	d := Details{
		Owner: OwnerBus, Frame: json.RawMessage(` {"b": 2,  "a": "<&>"} `), TimeoutMs: 30000, Retryable: true,
		LatencyMs: &lat, RetryCount: &rc, ErrorCode: "TIMEOUT", Error: "line\n\"quoted\"\t\x01",
		Bus:   &BusMessage{MessageID: "m1", Payload: json.RawMessage(`{"x":1}`), Priority: 3},
		Extra: map[string]any{"peer": "p1", "hopCount": 2, "owner": "ignored", "ERRORCODE": "ignored too"},
	}
	// MarshalJSON (what the log stores) compacts raw values without HTML
	// escaping; json.Marshal also escapes them, as it does for any Marshaler.
	b, err := d.MarshalJSON()
	require.NoError(t, err)
	viaJSON, err := json.Marshal(d)
	require.NoError(t, err)
	require.Contains(t, string(viaJSON), `"frame":{"b":2,"a":"\u003c\u0026\u003e"}`)
	require.Equal(t, `{"owner":"bus","frame":{"b":2,"a":"<&>"},"timeoutMs":30000,"errorCode":"TIMEOUT",`+
		`"error":"line\n\"quoted\"\t\u0001","retryable":true,"latencyMs":42,`+
		`"bus":{"messageId":"m1","payload":{"x":1},"priority":3},"retryCount":0,"hopCount":2,"peer":"p1"}`, string(b))

	var got Details
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, OwnerBus, got.Owner)
	require.Equal(t, json.RawMessage(`{"b":2,"a":"<&>"}`), got.Frame)
	require.Equal(t, d.Error, got.Error)
	require.Equal(t, int64(42), *got.LatencyMs)
	require.Equal(t, 0, *got.RetryCount)
	require.Equal(t, map[string]any{"peer": "p1", "hopCount": json.Number("2")}, got.Extra)
	again, err := got.MarshalJSON()
	require.NoError(t, err)
	require.Equal(t, string(b), string(again))

	// Inside an Event the details stay one flat object.
	evb, err := json.Marshal(Event{Nonce: "n", State: Received, Details: Details{Extra: map[string]any{"k": true}}})
	require.NoError(t, err)
	require.Contains(t, string(evb), `"details":{"k":true}`)
}

func TestDetailsJSONKnownKeysWin(t *testing.T) {
	t.Parallel()
	var d Details
	require.NoError(t, json.Unmarshal([]byte(`{"errorCode":"A","Owner":"bus","x":{"y":[1,2]}}`), &d))
	require.Equal(t, "A", d.ErrorCode)
	require.Equal(t, OwnerBus, d.Owner)
	require.Equal(t, map[string]any{"x": map[string]any{"y": []any{json.Number("1"), json.Number("2")}}}, d.Extra)
	d.Extra["errorCode"] = "B"
	b, err := json.Marshal(d)
	require.NoError(t, err)
	require.Equal(t, `{"owner":"bus","errorCode":"A","x":{"y":[1,2]}}`, string(b))
}

func TestDetailsJSONErrors(t *testing.T) {
	t.Parallel()
	_, err := json.Marshal(Details{Error: "\xff"})
	require.Error(t, err)
	_, err = json.Marshal(Details{Result: json.RawMessage(`{`)})
	require.Error(t, err)
	var d Details
	require.Error(t, json.Unmarshal([]byte(`[]`), &d))
	require.Error(t, json.Unmarshal([]byte(`{"timeoutMs":"x"}`), &d))
	b, err := json.Marshal(Details{})
	require.NoError(t, err)
	require.Equal(t, `{}`, string(b))
}

func TestRawJSON(t *testing.T) {
	t.Parallel()
	var r RawJSON
	require.NoError(t, r.Scan(`{"a":1}`))
	require.Equal(t, RawJSON(`{"a":1}`), r)
	require.NoError(t, r.Scan(nil))
	require.Nil(t, r)
	require.Error(t, r.Scan(3))
	b, err := json.Marshal(struct{ R RawJSON }{})
	require.NoError(t, err)
	require.Equal(t, `{"R":null}`, string(b))
	require.NoError(t, json.Unmarshal([]byte(`[1]`), &r))
	require.Equal(t, RawJSON(`[1]`), r)
}

// FuzzDetailsJSON checks that decoding never panics and that whatever
// decodes re-encodes to a fixed point.
func FuzzDetailsJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"owner":"bus","frame":{"a":1},"extra":[1,2.5,"x"]}`, `{"latencyMs":null,"bus":{"messageId":"m"}}`,
		`{"Owner":"x","owner":"y","OWNER":"z"}`, `{"result":"\u00e9\ud83d\ude00","k":1e300}`, `{"retryCount":-1,"nextRetryAt":9007199254740993}`,
		`{"error":"\u0000<>&\u2028"}`, `null`, `{"bus":{"payload":  [ 1 , 2 ] }}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var d Details
		if err := json.Unmarshal(in, &d); err != nil {
			return
		}
		if d.normalize() != nil {
			return
		}
		b1, err := json.Marshal(d)
		if err != nil {
			return
		}
		var d2 Details
		require.NoError(t, json.Unmarshal(b1, &d2), string(b1))
		b2, err := json.Marshal(d2)
		require.NoError(t, err)
		require.Equal(t, string(b1), string(b2))
	})
}
