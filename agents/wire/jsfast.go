package wire

import (
	"unicode/utf8"

	"github.com/beamdir/beam/internal/jsonscan"
)

// jsFastMaxDepth bounds the nesting jsStringifyIsIdentity follows; deeper
// texts take the full parser (whose limit, MaxJSONDepth, is far above).
const jsFastMaxDepth = 64

// jsFastMaxKeys bounds the members of one object jsStringifyIsIdentity
// checks for duplicates (pairwise); larger objects take the full parser.
const jsFastMaxKeys = 32

// jsStringifyIsIdentity reports whether p is a JSON object that the full
// path (parseJSON, then the encoder's JSON.stringify) would accept and
// write back byte for byte, so that p can stand for its own JSStringify.
// It answers true only for a conservative subset: no whitespace, strings
// without escapes and in valid UTF-8, integers of at most 15 digits other
// than -0, no key that starts with a digit (array-index keys move first in
// JavaScript), no key twice in one object, nesting within jsFastMaxDepth
// and at most jsFastMaxKeys members per object. Everything else answers
// false and takes the full path; a fuzz target compares the two.
func jsStringifyIsIdentity(p []byte) bool {
	if len(p) == 0 || len(p) > MaxJSONBytes || p[0] != '{' {
		return false
	}
	end, ok := jsFastValue(p, 0, 0)
	return ok && end == len(p)
}

// jsFastValue checks the value at p[i] and returns the index after it.
func jsFastValue(p []byte, i, depth int) (int, bool) {
	if i >= len(p) {
		return 0, false
	}
	switch c := p[i]; {
	case c == '{':
		return jsFastObject(p, i, depth+1)
	case c == '[':
		return jsFastArray(p, i, depth+1)
	case c == '"':
		return jsFastString(p, i)
	case c == '-' || (c >= '0' && c <= '9'):
		return jsFastNumber(p, i)
	case c == 't':
		return jsFastLiteral(p, i, "true")
	case c == 'f':
		return jsFastLiteral(p, i, "false")
	case c == 'n':
		return jsFastLiteral(p, i, "null")
	}
	return 0, false
}

func jsFastLiteral(p []byte, i int, word string) (int, bool) {
	if len(p)-i < len(word) || string(p[i:i+len(word)]) != word {
		return 0, false
	}
	return i + len(word), true
}

// jsFastNumber accepts -?(0|[1-9][0-9]{0,14}) except -0: integers JSON.stringify writes as read.
func jsFastNumber(p []byte, i int) (int, bool) {
	start := i
	if p[i] == '-' {
		i++
	}
	digits := i
	for i < len(p) && p[i] >= '0' && p[i] <= '9' {
		i++
	}
	n := i - digits
	if n == 0 || n > 15 || (p[digits] == '0' && (n > 1 || digits > start)) {
		return 0, false
	}
	if i < len(p) && (p[i] == '.' || p[i] == 'e' || p[i] == 'E') {
		return 0, false
	}
	return i, true
}

// jsFastString accepts a string token without escapes in valid UTF-8.
func jsFastString(p []byte, i int) (int, bool) {
	end, escaped, nonASCII, ok := jsonscan.ScanString(p, i)
	if !ok || escaped || (nonASCII && !utf8.Valid(p[i+1:end-1])) {
		return 0, false
	}
	return end, true
}

func jsFastArray(p []byte, i, depth int) (int, bool) {
	if depth > jsFastMaxDepth {
		return 0, false
	}
	i++
	if i < len(p) && p[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = jsFastValue(p, i, depth); !ok || i >= len(p) {
			return 0, false
		}
		switch p[i] {
		case ',':
			i++
		case ']':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

func jsFastObject(p []byte, i, depth int) (int, bool) {
	if depth > jsFastMaxDepth {
		return 0, false
	}
	i++
	if i < len(p) && p[i] == '}' {
		return i + 1, true
	}
	var keys [jsFastMaxKeys][]byte
	n := 0
	for {
		if i >= len(p) || p[i] != '"' || n == jsFastMaxKeys {
			return 0, false
		}
		end, ok := jsFastString(p, i)
		if !ok {
			return 0, false
		}
		key := p[i+1 : end-1]
		if len(key) > 0 && key[0] >= '0' && key[0] <= '9' {
			return 0, false
		}
		for _, k := range keys[:n] {
			if string(k) == string(key) {
				return 0, false
			}
		}
		keys[n] = key
		n++
		i = end
		if i >= len(p) || p[i] != ':' {
			return 0, false
		}
		if i, ok = jsFastValue(p, i+1, depth); !ok || i >= len(p) {
			return 0, false
		}
		switch p[i] {
		case ',':
			i++
		case '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}
