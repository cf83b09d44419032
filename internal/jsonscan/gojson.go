package jsonscan

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// The Marshal* appenders write values byte for byte as encoding/json.Marshal
// does (HTML escaping on), for encoders that build JSON by hand and must
// keep what encoding/json wrote before them.

// MayNeedHTMLEscape reports whether JSON text t may hold a character
// json.Marshal escapes beyond NeedsEscape: <, >, &, U+2028 or U+2029. It
// looks for bytes (0xE2 leads both line separators, and other characters
// too), so it may answer true needlessly, never false wrongly.
func MayNeedHTMLEscape[T Text](t T) bool {
	for _, c := range [...]byte{'<', '>', '&', 0xE2} {
		if indexByte(t, c) >= 0 {
			return true
		}
	}
	return false
}

func indexByte[T Text](t T, c byte) int {
	switch v := any(t).(type) {
	case string:
		return strings.IndexByte(v, c)
	case []byte:
		return bytes.IndexByte(v, c)
	}
	for i := 0; i < len(t); i++ {
		if t[i] == c {
			return i
		}
	}
	return -1
}

// AppendMarshalString appends s as json.Marshal writes it: like
// AppendString, with <, >, &, U+2028 and U+2029 escaped and invalid UTF-8
// replaced by U+FFFD (those rare strings go through encoding/json).
func AppendMarshalString(b []byte, s string) []byte {
	n := len(b)
	if out, ok := AppendString(b, s); ok && !MayNeedHTMLEscape(s) {
		return out
	}
	enc, _ := json.Marshal(s) // a string always encodes
	return append(b[:n], enc...)
}

// AppendMarshalRaw appends compact, valid JSON raw as json.Marshal writes a
// json.RawMessage holding it (compacted, which changes nothing here, and
// HTML-escaped).
func AppendMarshalRaw(b []byte, raw []byte) []byte {
	if !MayNeedHTMLEscape(raw) {
		return append(b, raw...)
	}
	var buf bytes.Buffer
	json.HTMLEscape(&buf, raw)
	return append(b, buf.Bytes()...)
}

// AppendMarshalFloat appends f as json.Marshal writes a float64; it returns
// false for NaN and infinities, which JSON cannot hold.
func AppendMarshalFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 to e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}
