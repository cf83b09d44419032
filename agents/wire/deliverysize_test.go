package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fullDeliverySize is DeliverySize by definition: JSON.stringify of the whole delivered frame.
func fullDeliverySize(f *IntentFrame) (int, error) {
	d, err := f.DeliveryJSON()
	if err != nil {
		return 0, err
	}
	s, err := JSStringify(d)
	if err != nil {
		return 0, err
	}
	return len(s), nil
}

// FuzzDeliverySize checks that the size computed from the payload alone equals JSON.stringify of the
// whole delivered frame, for every frame the decoder accepts.
func FuzzDeliverySize(f *testing.F) {
	f.Add([]byte(testFrame))
	f.Add([]byte(`{"from":"a","to":"b","intent":"i","params":{"x":[1,2]},"nonce":"n","timestamp":"t","signature":"s","extra":{"1":2}}`))
	f.Add([]byte(`{"from":"a","to":"b","intent":"i","params":{"x":1e21,"y":1E2},"payload":7,"nonce":"n","timestamp":"t"}`))
	f.Add([]byte(`{"v":2,"from":"a\u00e9","to":"b\/c","intent":"i\u2028","payload":{ "x" : "\u00e9\ud800" , "0":[ 1.50 ,-0]},"nonce":"n","timestamp":"t","signature":"\ud800"}`))
	f.Add([]byte(`{"from":"a","to":"b","intent":"i","payload":{},"params":{"p":1},"nonce":"n","timestamp":"t"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeIntentFrame(data)
		if err != nil {
			return
		}
		p := []byte(fr.Payload)
		if len(p) == 0 {
			p = []byte("{}")
		}
		wantJS, err := JSStringify(p)
		require.NoError(t, err)
		gotJS, err := fr.PayloadJS()
		require.NoError(t, err)
		require.Equal(t, string(wantJS), string(gotJS), "payload of %q", data)

		want, wantErr := fullDeliverySize(fr)
		got, err := fr.DeliverySize()
		if wantErr != nil {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, got, "frame %q", data)
	})
}

func TestDeliverySizeOfFramesBuiltInGo(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	deep := strings.Repeat(`{"a":`, MaxJSONDepth) + "1" + strings.Repeat("}", MaxJSONDepth)
	for _, payload := range []string{``, `{}`, `{"m":"ü","n":1.0,"big":1e20}`, `{ "a" : [ 1 , 2 ] }`, `{"a":1,"a":2}`, deep} {
		fr := NewIntentFrame("a@acme.beam.directory", "b@acme.beam.directory", "x", json.RawMessage(payload), now)
		fr.From = "a\xffb@acme.beam.directory" // not UTF-8: only the full computation applies
		for range 2 {
			want, wantErr := fullDeliverySize(fr)
			got, err := fr.DeliverySize()
			if wantErr != nil {
				require.Error(t, err, payload)
			} else {
				require.NoError(t, err, payload)
				require.Equal(t, want, got, payload)
			}
			fr.From = "a@acme.beam.directory"
		}
	}
}

func TestPayloadJSFollowsAReplacedPayload(t *testing.T) {
	t.Parallel()
	fr, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)
	js, err := fr.PayloadJS()
	require.NoError(t, err)
	require.Equal(t, `{"2":"x","b":1,"a":{"ü":1}}`, string(js))

	// The tree from decoding is used only for the payload it was parsed from.
	fr.Payload = json.RawMessage(`{"z": 2.50}`)
	js, err = fr.PayloadJS()
	require.NoError(t, err)
	require.Equal(t, `{"z":2.5}`, string(js))
	fr.Payload = append(json.RawMessage(nil), fr.Raw[strings.Index(string(fr.Raw), `{"b"`):][:len(`{"b":1,"2":"x","a":{"ü":1.0}}`)]...)
	js, err = fr.PayloadJS()
	require.NoError(t, err)
	require.Equal(t, `{"2":"x","b":1,"a":{"ü":1}}`, string(js))
	fr.Payload = json.RawMessage(`[1]`)
	_, err = fr.PayloadJS()
	require.Error(t, err, "a payload must be an object")

	// Verify still checks the replaced payload.
	b := setupIntent(t)
	g, err := DecodeIntentFrame([]byte(testFrame))
	require.NoError(t, err)
	require.NoError(t, SignIntent(g, b.priv))
	require.NoError(t, g.Verify(b.pub))
	g.Payload = json.RawMessage(`{"b":2,"2":"x","a":{"ü":1.0}}`)
	require.Error(t, g.Verify(b.pub), "a replaced payload is verified, not the decoded one")
}
