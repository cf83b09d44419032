package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// encodingJSON is s as encoding/json writes it without HTML escaping.
func encodingJSON(t *testing.T, s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(s))
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// decode is what ScanString, Unescape and Hex4 make of a string token
// without surrogate escapes, the way the callers decode.
func decode(tok []byte) (string, bool) {
	var out []byte
	for i := 1; i < len(tok)-1; i++ {
		if tok[i] != '\\' {
			out = append(out, tok[i])
			continue
		}
		i++
		if tok[i] == 'u' {
			r, ok := Hex4(tok[i+1:])
			if !ok || (r >= 0xD800 && r <= 0xDFFF) {
				return "", false
			}
			out = utf8.AppendRune(out, r)
			i += 4
			continue
		}
		c, ok := Unescape(tok[i])
		if !ok {
			return "", false
		}
		out = append(out, c)
	}
	return string(out), true
}

// FuzzString checks the primitives against encoding/json both ways: the
// token encoding/json writes for a valid UTF-8 s, ScanString and the escape
// decoders read back as s; a token ScanString
// accepts, encoding/json accepts, and a string token encoding/json accepts,
// ScanString accepts to its end.
func FuzzString(f *testing.F) {
	for _, s := range []string{"", "a", `"`, `\`, "\x00", "\u2028", "é😀", `"\u00e9\n"`, `"\ud83d\ude00"`, `"\x"`, `"abc`, "\"\xff\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Reading what encoding/json writes.
		if utf8.ValidString(s) {
			got := encodingJSON(t, s)
			end, escaped, nonASCII, ok := ScanString(got, 0)
			require.True(t, ok)
			require.Equal(t, len(got), end)
			if !strings.ContainsAny(s, "\u2028\u2029") { // encoding/json escapes these two; JSON does not require it
				require.Equal(t, strings.ContainsFunc(s, func(r rune) bool { return r < 0x80 && NeedsEscape(byte(r)) }), escaped)
				require.Equal(t, strings.ContainsFunc(s, func(r rune) bool { return r >= 0x80 }), nonASCII)
			}
			dec, ok := decode(got)
			require.True(t, ok)
			require.Equal(t, s, dec)
		}
		// Scanning arbitrary input as a string token.
		d := []byte(s)
		if len(d) == 0 || d[0] != '"' {
			d = append([]byte{'"'}, d...)
		}
		end, _, _, ok := ScanString(d, 0)
		if ok {
			require.True(t, json.Valid(d[:end]) || !utf8.Valid(d[:end]), "ScanString accepted %q", d[:end])
		}
		if json.Valid(d) {
			require.True(t, ok, "encoding/json accepts %q", d)
			require.Equal(t, len(bytes.TrimRight(d, " \t\r\n")), end)
		}
		require.Equal(t, SkipSpace(d, 0), 0)
	})
}
