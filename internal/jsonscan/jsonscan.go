package jsonscan

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// text is JSON text held as bytes or as a string.
type text interface{ ~string | ~[]byte }

// HexVal is the value of the hexadecimal digit c; false when c is not one.
func HexVal(c byte) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0'), true
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10, true
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10, true
	}
	return 0, false
}

// Hex4 decodes the four hexadecimal digits at the start of d (the XXXX of
// a \uXXXX escape); false when d is shorter or holds another byte.
func Hex4[T text](d T) (rune, bool) {
	if len(d) < 4 {
		return 0, false
	}
	var r rune
	for i := range 4 {
		v, ok := HexVal(d[i])
		if !ok {
			return 0, false
		}
		r = r<<4 | v
	}
	return r, true
}

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func SkipSpace[T text](d T, i int) int {
	for i < len(d) {
		switch d[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// special marks the bytes a string scan must stop at: the quote, the
// backslash, control characters and non-ASCII bytes.
var special = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf
	}
	return t
}()

// ScanString validates the string token starting at d[i] == '"' as
// encoding/json does: no control characters and only JSON escapes; any
// other byte, invalid UTF-8 included, is accepted. It returns the index
// after the closing quote, whether the token holds an escape and whether
// it holds a non-ASCII byte; ok is false for an invalid or unterminated
// token.
func ScanString[T text](d T, i int) (end int, escaped, nonASCII, ok bool) {
	for i++; i < len(d); {
		c := d[i]
		if !special[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			return i + 1, escaped, nonASCII, true
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				return 0, false, false, false
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := Hex4(d[i+2:]); !ok {
					return 0, false, false, false
				}
				i += 6
			default:
				return 0, false, false, false
			}
		case c < 0x20:
			return 0, false, false, false
		default:
			nonASCII = true
			i++
		}
	}
	return 0, false, false, false
}

// Unescape is the byte a one-character escape \e stands for; false for
// 'u' (see Hex4) and for characters JSON does not allow after a backslash.
func Unescape(e byte) (byte, bool) {
	switch e {
	case '"', '\\', '/':
		return e, true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}

// NeedsEscape reports whether the ASCII byte c must be escaped inside a
// JSON string: the quote, the backslash and control characters.
func NeedsEscape(c byte) bool { return c < 0x20 || c == '"' || c == '\\' }

// AppendEscape appends the escape of the ASCII byte c (one NeedsEscape
// accepts) the way JSON.stringify and encoding/json write it: the
// two-character forms where JSON has one, \u00XX (lowercase) otherwise.
func AppendEscape(b []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return AppendUnicodeEscape(b, rune(c))
}

// AppendUnicodeEscape appends r (at most U+FFFF) as \uxxxx, lowercase.
func AppendUnicodeEscape(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xF], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
}
