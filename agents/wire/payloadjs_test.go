package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// payloadJSCases are payloads with what the signing input holds for them: the text itself when
// JSON.stringify writes it back unchanged, another text when it does not, and "" when the payload is
// refused.
var payloadJSCases = []struct {
	in, want string
}{
	{`{}`, `{}`},
	{`{"id":"a","route":{"prev":[],"curr":"x","next":["y","z"]},"hop":0,"n":-12,"ok":true,"v":null,"f":false}`,
		`{"id":"a","route":{"prev":[],"curr":"x","next":["y","z"]},"hop":0,"n":-12,"ok":true,"v":null,"f":false}`},
	{`{"u":"üñí😀","e":""}`, `{"u":"üñí😀","e":""}`},
	{`{"a":[1,[2,[3]],{"b":{}}],"c":[]}`, `{"a":[1,[2,[3]],{"b":{}}],"c":[]}`},
	{`{"n":123456789012345}`, `{"n":123456789012345}`},
	{`{"n":12345678901234567890}`, `{"n":12345678901234567000}`}, // past float64's integers
	{`{"n":-0}`, `{"n":0}`},
	{`{"n":1.0}`, `{"n":1}`},
	{`{"n":1e2}`, `{"n":100}`},
	{`{"a":1,"a":2}`, `{"a":2}`},       // the last one wins, as in JavaScript
	{`{"b":1,"2":2}`, `{"2":2,"b":1}`}, // array-index keys move first
	{`{"s":"a\/b"}`, `{"s":"a/b"}`},
	{`{"s":"\u00e9"}`, `{"s":"é"}`},
	{"{\"s\":\"\xff\"}", `{"s":"` + "\uFFFD" + `"}`}, // invalid UTF-8 becomes U+FFFD
	{`{ "a":1}`, `{"a":1}`},
	{`{"a":1} `, `{"a":1}`},
	{`[1]`, ``},
	{`"x"`, ``},
	{`{"a":tru}`, ``},
	{`{"a":[1,]}`, ``},
	{`{"a":1,}`, ``},
	{`{"a"}`, ``},
	{`{"a":1}{}`, ``},
}

// TestPayloadJS checks the payload bytes an intent is signed over, PayloadJS and JSStringify alike, for
// payloads JSON.stringify writes back unchanged and for ones it rewrites.
func TestPayloadJS(t *testing.T) {
	t.Parallel()
	for _, c := range payloadJSCases {
		fr := &IntentFrame{From: "a@x.beam.directory", To: "b@x.beam.directory", Intent: "t", Payload: []byte(c.in),
			Timestamp: "2026-01-01T00:00:00Z", Nonce: "n"}
		got, err := fr.PayloadJS()
		if c.want == "" {
			require.Error(t, err, "%q", c.in)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, string(got), "%q", c.in)
		js, err := JSStringify([]byte(c.in))
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, string(js), "%q", c.in)
		in, err := fr.SigningInput()
		require.NoError(t, err)
		require.Equal(t, string(fr.appendEnvelope(nil, appendJSString, js)), string(in))
	}
}
