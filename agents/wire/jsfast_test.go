package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// jsFastSeeds are texts the fast path must accept or refuse; the fuzz
// target starts from them.
var jsFastSeeds = []struct {
	in       string
	identity bool
}{
	{`{}`, true},
	{`{"id":"a","route":{"prev":[],"curr":"x","next":["y","z"]},"hop":0,"n":-12,"ok":true,"v":null,"f":false}`, true},
	{`{"u":"üñí😀","e":""}`, true},
	{`{"a":[1,[2,[3]],{"b":{}}],"c":[]}`, true},
	{`{"n":123456789012345}`, true},
	{`{"n":1234567890123456}`, false}, // 16 digits: may not survive float64
	{`{"n":-0}`, false},               // JSON.stringify writes 0
	{`{"n":01}`, false},
	{`{"n":1.0}`, false},
	{`{"n":1e2}`, false},
	{`{"a":1,"a":2}`, false}, // duplicate key
	{`{"b":1,"2":2}`, false}, // array-index key moves first
	{`{"s":"a\/b"}`, false},  // escapes are rewritten
	{`{"s":"\u00e9"}`, false},
	{"{\"s\":\"\xff\"}", false}, // invalid UTF-8 becomes U+FFFD
	{"{\"s\":\"\xed\xa0\x80\"}", false},
	{`{ "a":1}`, false},
	{`{"a":1} `, false},
	{`[1]`, false},
	{`"x"`, false},
	{``, false},
	{`{"a":tru}`, false},
	{`{"a":[1,]}`, false},
	{`{"a":1,}`, false},
	{`{"a"}`, false},
	{`{"a":1}{}`, false},
}

func TestJSStringifyIsIdentity(t *testing.T) {
	t.Parallel()
	for _, c := range jsFastSeeds {
		require.Equal(t, c.identity, jsStringifyIsIdentity([]byte(c.in)), "%q", c.in)
		checkJSFast(t, []byte(c.in))
	}
}

// checkJSFast fails when the fast path calls in its own JSStringify but the
// full parser and encoder disagree (an error, or other bytes), and when the
// signing input of a frame with that payload differs between the two.
func checkJSFast(t *testing.T, in []byte) {
	t.Helper()
	if !jsStringifyIsIdentity(in) {
		return
	}
	n, err := parseJSON(in)
	require.NoError(t, err, "%q", in)
	require.Equal(t, kindObject, n.kind, "%q", in)
	e := encoder{}
	full, err := e.appendNode(nil, n, true)
	require.NoError(t, err, "%q", in)
	require.Equal(t, string(full), string(in))
	fr := &IntentFrame{From: "a@x.beam.directory", To: "b@x.beam.directory", Intent: "t", Payload: in,
		Timestamp: "2026-01-01T00:00:00Z", Nonce: "n"}
	got, err := fr.SigningInput()
	require.NoError(t, err)
	require.Equal(t, string(fr.appendEnvelope(nil, appendJSString, full)), string(got))
}

// FuzzJSStringifyIsIdentity compares the fast path with the full parser and
// encoder for any input: whenever it answers true, they write the input
// back unchanged.
func FuzzJSStringifyIsIdentity(f *testing.F) {
	for _, c := range jsFastSeeds {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkJSFast(t, in)
	})
}
