package wire

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/beamdir/beam/internal/jsonscan"
)

// MaxJSONDepth bounds how deeply arrays and objects may nest in any JSON this package parses.
const MaxJSONDepth = 512

// MaxJSONBytes bounds the size of any JSON text JSStringify, CanonicalJSON and the frame decoders accept.
const MaxJSONBytes = 1 << 20

// ErrJSONTooLarge is returned for JSON texts longer than MaxJSONBytes.
var ErrJSONTooLarge = errors.New("json text exceeds size limit")

// SyntaxError reports invalid JSON and the byte offset where it was detected.
type SyntaxError struct {
	Offset int
	Msg    string
}

// Error implements error.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid json at offset %d: %s", e.Offset, e.Msg)
}

// kind of a parsed JSON value.
type kind uint8

const (
	kindNull kind = iota
	kindFalse
	kindTrue
	kindNumber
	kindString
	kindArray
	kindObject
)

// node is one parsed JSON value. Object members keep the order of first occurrence; a duplicate key
// replaces the value at the first key's position, as JSON.parse does.
//
// Strings are stored decoded, in a UTF-8 superset: a lone surrogate (only possible through a \uD8xx
// escape) is kept as its 3-byte generalized UTF-8 form (0xED 0xA0..0xBF 0x80..0xBF). Raw invalid UTF-8
// in the input is replaced by U+FFFD the way a WHATWG UTF-8 decoder (Node's) does.
type node struct {
	kind  kind
	str   string  // decoded string, or the number's literal text
	num   float64 // number value as JavaScript's Number
	keys  []string
	elems []*node // object values (parallel to keys) or array elements
	start int     // byte span of the value in the parsed text
	end   int
}

// member returns the value of key in an object node, or nil.
func (n *node) member(key string) *node {
	if n == nil || n.kind != kindObject {
		return nil
	}
	for i, k := range n.keys {
		if k == key {
			return n.elems[i]
		}
	}
	return nil
}

type parser struct {
	data  []byte
	pos   int
	depth int
	// dup is the first key found twice in one object (at any depth), with
	// dupSeen set; JSON.parse keeps the last value, other parsers the first.
	dup     string
	dupSeen bool
}

// parseJSON parses one JSON text (surrounding whitespace allowed) with JSON.parse semantics.
func parseJSON(data []byte) (*node, error) {
	n, _, err := parseJSONDup(data)
	return n, err
}

// DuplicateKeyError reports a JSON object that names one key twice. Parsers disagree on which value
// wins (JSON.parse keeps the last, many others the first), so a signed frame with one would mean
// different things to the signer and to a recipient.
type DuplicateKeyError struct {
	// Key is the first duplicated key found.
	Key string
}

// Error implements error.
func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("duplicate JSON object key %q", e.Key)
}

// parseStrictJSON is parseJSON that refuses a duplicated object key at any depth with a
// *DuplicateKeyError.
func parseStrictJSON(data []byte) (*node, error) {
	n, dup, err := parseJSONDup(data)
	if err != nil {
		return nil, err
	}
	if dup != nil {
		return nil, dup
	}
	return n, nil
}

// CheckNoDuplicateKeys returns a *DuplicateKeyError when the JSON text data has an object with a
// duplicated key at any depth, a parse error when it is not JSON, and nil otherwise.
func CheckNoDuplicateKeys(data []byte) error {
	_, err := parseStrictJSON(data)
	return err
}

// parseJSONDup is parseJSON that also reports the first duplicated object key.
func parseJSONDup(data []byte) (*node, *DuplicateKeyError, error) {
	n, p, err := parseWith(data)
	if err != nil {
		return nil, nil, err
	}
	if p.dupSeen {
		return n, &DuplicateKeyError{Key: p.dup}, nil
	}
	return n, nil, nil
}

func parseWith(data []byte) (*node, *parser, error) {
	return parseAt(data, 0)
}

// parseAt is parseWith for a text that sits depth levels deep in an enclosing one: the nesting limit
// counts those levels.
func parseAt(data []byte, depth int) (*node, *parser, error) {
	if len(data) > MaxJSONBytes {
		return nil, nil, ErrJSONTooLarge
	}
	p := &parser{data: data, depth: depth}
	p.skipSpace()
	n, err := p.value()
	if err != nil {
		return nil, nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, nil, p.errf("unexpected data after top-level value")
	}
	return n, p, nil
}

func (p *parser) errf(format string, args ...any) error {
	return &SyntaxError{Offset: p.pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) skipSpace() { p.pos = jsonscan.SkipSpace(p.data, p.pos) }

func (p *parser) value() (*node, error) {
	if p.pos >= len(p.data) {
		return nil, p.errf("unexpected end of input")
	}
	start := p.pos
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return &node{kind: kindString, str: s, start: start, end: p.pos}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return p.literal("true", kindTrue)
	case c == 'f':
		return p.literal("false", kindFalse)
	case c == 'n':
		return p.literal("null", kindNull)
	default:
		return nil, p.errf("unexpected character %q", c)
	}
}

func (p *parser) literal(word string, k kind) (*node, error) {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return nil, p.errf("invalid literal")
	}
	start := p.pos
	p.pos += len(word)
	return &node{kind: k, start: start, end: p.pos}, nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > MaxJSONDepth {
		return p.errf("nesting deeper than %d", MaxJSONDepth)
	}
	return nil
}

func (p *parser) object() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	n := &node{kind: kindObject, start: p.pos}
	p.pos++ // '{'
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		n.end = p.pos
		p.depth--
		return n, nil
	}
	var index map[string]int // built lazily for larger objects
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.errf("expected object key")
		}
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.errf("expected ':' after object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		at := -1
		if index != nil {
			if i, ok := index[key]; ok {
				at = i
			}
		} else {
			at = slices.Index(n.keys, key)
		}
		if at >= 0 {
			if !p.dupSeen {
				p.dup, p.dupSeen = key, true
			}
			n.elems[at] = v
		} else {
			n.keys = append(n.keys, key)
			n.elems = append(n.elems, v)
			if index != nil {
				index[key] = len(n.keys) - 1
			} else if len(n.keys) > 16 {
				index = make(map[string]int, 2*len(n.keys))
				for i, k := range n.keys {
					index[k] = i
				}
			}
		}
		done, err := p.separator(n, '}', "object")
		if err != nil {
			return nil, err
		}
		if done {
			return n, nil
		}
	}
}

func (p *parser) array() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	n := &node{kind: kindArray, start: p.pos}
	p.pos++ // '['
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		n.end = p.pos
		p.depth--
		return n, nil
	}
	for {
		p.skipSpace()
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		n.elems = append(n.elems, v)
		done, err := p.separator(n, ']', "array")
		if err != nil {
			return nil, err
		}
		if done {
			return n, nil
		}
	}
}

// separator reads what follows a member of the container n: a comma (more
// members follow) or its closing byte, which ends n.
func (p *parser) separator(n *node, closing byte, what string) (done bool, err error) {
	p.skipSpace()
	if p.pos >= len(p.data) {
		return false, p.errf("unexpected end of input in %s", what)
	}
	switch p.data[p.pos] {
	case ',':
		p.pos++
		return false, nil
	case closing:
		p.pos++
		n.end = p.pos
		p.depth--
		return true, nil
	default:
		return false, p.errf("expected ',' or '%c' in %s", closing, what)
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *parser) number() (*node, error) {
	start := p.pos
	d := p.data
	if d[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(d) && d[p.pos] == '0':
		p.pos++
	case p.pos < len(d) && isDigit(d[p.pos]):
		for p.pos < len(d) && isDigit(d[p.pos]) {
			p.pos++
		}
	default:
		return nil, p.errf("invalid number")
	}
	if p.pos < len(d) && d[p.pos] == '.' {
		p.pos++
		if p.pos >= len(d) || !isDigit(d[p.pos]) {
			return nil, p.errf("invalid number: digit expected after '.'")
		}
		for p.pos < len(d) && isDigit(d[p.pos]) {
			p.pos++
		}
	}
	if p.pos < len(d) && (d[p.pos] == 'e' || d[p.pos] == 'E') {
		p.pos++
		if p.pos < len(d) && (d[p.pos] == '+' || d[p.pos] == '-') {
			p.pos++
		}
		if p.pos >= len(d) || !isDigit(d[p.pos]) {
			return nil, p.errf("invalid number: digit expected in exponent")
		}
		for p.pos < len(d) && isDigit(d[p.pos]) {
			p.pos++
		}
	}
	text := string(d[start:p.pos])
	// ParseFloat rounds correctly, as JSON.parse does; out-of-range values come back as ±Inf or 0
	// with ErrRange, which matches JavaScript's Infinity and underflow to zero.
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, p.errf("invalid number %q", text)
	}
	return &node{kind: kindNumber, str: text, num: f, start: start, end: p.pos}, nil
}

func (p *parser) hex4() (rune, error) {
	if len(p.data)-p.pos < 4 {
		return 0, p.errf("truncated \\u escape")
	}
	r, ok := jsonscan.Hex4(p.data[p.pos:])
	if !ok {
		return 0, p.errf("invalid \\u escape")
	}
	p.pos += 4
	return r, nil
}

// appendSurrogate appends a lone surrogate in its generalized 3-byte UTF-8 form.
func appendSurrogate(b []byte, r rune) []byte {
	return append(b, 0xED, byte(0x80|(r>>6)&0x3F), byte(0x80|r&0x3F))
}

// str parses a string literal starting at '"' and returns its decoded value.
func (p *parser) str() (string, error) {
	p.pos++ // opening quote
	d := p.data
	// Fast path: no escapes, ASCII or valid UTF-8 up to the closing quote.
	start := p.pos
	for i := p.pos; i < len(d); i++ {
		c := d[i]
		if c == '"' {
			if utf8.Valid(d[start:i]) {
				p.pos = i + 1
				return string(d[start:i]), nil
			}
			break
		}
		if c == '\\' || c < 0x20 {
			break
		}
	}
	var b []byte
	for {
		if p.pos >= len(d) {
			return "", p.errf("unterminated string")
		}
		c := d[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(b), nil
		case c < 0x20:
			return "", p.errf("control character in string")
		case c == '\\':
			p.pos++
			if p.pos >= len(d) {
				return "", p.errf("unterminated escape")
			}
			e := d[p.pos]
			p.pos++
			if c, ok := jsonscan.Unescape(e); ok {
				b = append(b, c)
				continue
			}
			switch e {
			case 'u':
				r, err := p.hex4()
				if err != nil {
					return "", err
				}
				if utf16.IsSurrogate(r) {
					if r < 0xDC00 && len(d)-p.pos >= 6 && d[p.pos] == '\\' && d[p.pos+1] == 'u' {
						save := p.pos
						p.pos += 2
						r2, err := p.hex4()
						if err != nil {
							return "", err
						}
						if r2 >= 0xDC00 && r2 <= 0xDFFF {
							b = utf8.AppendRune(b, utf16.DecodeRune(r, r2))
							continue
						}
						p.pos = save
					}
					b = appendSurrogate(b, r)
					continue
				}
				b = utf8.AppendRune(b, r)
			default:
				return "", p.errf("invalid escape character %q", e)
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(d[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				b = utf8.AppendRune(b, utf8.RuneError)
				p.pos += invalidUTF8Len(d[p.pos:])
				continue
			}
			b = append(b, d[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

// invalidUTF8Len is the length of the maximal subpart of an ill-formed UTF-8 sequence at the start of
// b, which a WHATWG decoder replaces with a single U+FFFD.
func invalidUTF8Len(b []byte) int {
	lead := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case lead >= 0xC2 && lead <= 0xDF:
		need = 1
	case lead == 0xE0:
		need, lo = 2, 0xA0
	case lead == 0xED:
		need, hi = 2, 0x9F
	case lead >= 0xE1 && lead <= 0xEF:
		need = 2
	case lead == 0xF0:
		need, lo = 3, 0x90
	case lead == 0xF4:
		need, hi = 3, 0x8F
	case lead >= 0xF1 && lead <= 0xF3:
		need = 3
	default:
		return 1
	}
	i := 1
	for ; i <= need && i < len(b); i++ {
		if b[i] < lo || b[i] > hi {
			return i
		}
		lo, hi = 0x80, 0xBF
	}
	return i
}

// decodeWTF8 decodes one code point of a decoded string; lone surrogates come back as themselves.
func decodeWTF8(s string) (rune, int) {
	if len(s) >= 3 && s[0] == 0xED && s[1] >= 0xA0 && s[1] <= 0xBF && s[2] >= 0x80 && s[2] <= 0xBF {
		return rune(0xD000) | rune(s[1]&0x3F)<<6 | rune(s[2]&0x3F), 3
	}
	return utf8.DecodeRuneInString(s)
}

// hasLoneSurrogate reports whether a decoded string holds a lone surrogate.
func hasLoneSurrogate(s string) bool {
	for i := 0; i < len(s); {
		r, size := decodeWTF8(s[i:])
		if utf16.IsSurrogate(r) {
			return true
		}
		i += size
	}
	return false
}

// appendJSString appends s quoted as JSON.stringify does: raw UTF-8, with only '"', '\\' and control
// characters escaped, and lone surrogates as lowercase \udxxx.
func appendJSString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf && !jsonscan.NeedsEscape(c) {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := decodeWTF8(s[i:])
			if r == utf8.RuneError && size == 1 {
				// Raw invalid UTF-8 (only possible in strings from Go callers): write U+FFFD.
				b = append(b, s[start:i]...)
				b = append(b, "\uFFFD"...)
				i++
				start = i
				continue
			}
			if !utf16.IsSurrogate(r) {
				i += size
				continue
			}
			b = jsonscan.AppendUnicodeEscape(append(b, s[start:i]...), r)
			i += size
			start = i
			continue
		}
		b = jsonscan.AppendEscape(append(b, s[start:i]...), c)
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendASCIIString appends s quoted the way Python's json.dumps does with ensure_ascii: everything
// outside printable ASCII is a lowercase \uxxxx escape (astral characters as surrogate pairs).
func appendASCIIString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		r, size := decodeWTF8(s[i:])
		i += size
		switch {
		case r < utf8.RuneSelf && jsonscan.NeedsEscape(byte(r)):
			b = jsonscan.AppendEscape(b, byte(r))
		case r >= 0x20 && r <= 0x7E:
			b = append(b, byte(r))
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			b = jsonscan.AppendUnicodeEscape(jsonscan.AppendUnicodeEscape(b, r1), r2)
		default:
			b = jsonscan.AppendUnicodeEscape(b, r)
		}
	}
	return append(b, '"')
}

// appendJSNumber appends f formatted as JavaScript's Number.prototype.toString (and JSON.stringify)
// does: shortest round-trip digits, plain decimal for 1e-7 < |f| < 1e21, exponent form otherwise,
// -0 as 0, and non-finite values as null.
func appendJSNumber(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	if f == 0 {
		return append(b, '0')
	}
	if f < 0 {
		b = append(b, '-')
		f = -f
	}
	var tmp [32]byte
	e := strconv.AppendFloat(tmp[:0], f, 'e', -1, 64) // d[.ddd]e±XX
	epos := 0
	for epos < len(e) && e[epos] != 'e' {
		epos++
	}
	var digits [24]byte
	k := 0
	for _, c := range e[:epos] {
		if c != '.' {
			digits[k] = c
			k++
		}
	}
	exp, _ := strconv.Atoi(string(e[epos+1:]))
	n := exp + 1 // value = 0.d1d2…dk × 10^n
	ds := digits[:k]
	switch {
	case k <= n && n <= 21:
		b = append(b, ds...)
		for i := k; i < n; i++ {
			b = append(b, '0')
		}
	case 0 < n && n <= 21:
		b = append(b, ds[:n]...)
		b = append(b, '.')
		b = append(b, ds[n:]...)
	case -6 < n && n <= 0:
		b = append(b, '0', '.')
		for i := 0; i < -n; i++ {
			b = append(b, '0')
		}
		b = append(b, ds...)
	default:
		b = append(b, ds[0])
		if k > 1 {
			b = append(b, '.')
			b = append(b, ds[1:]...)
		}
		b = append(b, 'e')
		if n-1 >= 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, int64(n-1), 10)
	}
	return b
}

// arrayIndex reports whether key is an array index (the canonical decimal form of an integer below
// 2^32-1) and returns its value. JavaScript enumerates such keys first, in ascending numeric order.
func arrayIndex(key string) (uint32, bool) {
	if len(key) == 0 || len(key) > 10 || (key[0] == '0' && len(key) > 1) {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(key); i++ {
		if !isDigit(key[i]) {
			return 0, false
		}
		v = v*10 + uint64(key[i]-'0')
	}
	if v >= math.MaxUint32 {
		return 0, false
	}
	return uint32(v), true
}

// jsOrder returns the member positions of an object in JavaScript's own-property enumeration order:
// array-index keys ascending, then the rest in insertion order (or sorted by UTF-16 code units).
func jsOrder(keys []string, sorted bool) []int {
	order := make([]int, 0, len(keys))
	var idx []int
	for i, k := range keys {
		if _, ok := arrayIndex(k); ok {
			idx = append(idx, i)
		} else {
			order = append(order, i)
		}
	}
	if sorted {
		slices.SortFunc(order, func(a, b int) int { return compareUTF16(keys[a], keys[b]) })
	}
	if len(idx) == 0 {
		return order
	}
	slices.SortFunc(idx, func(a, b int) int {
		x, _ := arrayIndex(keys[a])
		y, _ := arrayIndex(keys[b])
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return append(idx, order...)
}

// compareUTF16 compares two decoded strings by UTF-16 code units, as JavaScript's default sort does.
func compareUTF16(a, b string) int {
	ia, ib := utf16Iter{s: a}, utf16Iter{s: b}
	for {
		ua, oka := ia.next()
		ub, okb := ib.next()
		switch {
		case !oka && !okb:
			return 0
		case !oka:
			return -1
		case !okb:
			return 1
		case ua != ub:
			return int(ua) - int(ub)
		}
	}
}

// utf16Iter yields the UTF-16 code units of a decoded string.
type utf16Iter struct {
	s       string
	i       int
	pending rune // second unit of an astral character, or 0
}

func (it *utf16Iter) next() (rune, bool) {
	if it.pending != 0 {
		u := it.pending
		it.pending = 0
		return u, true
	}
	if it.i >= len(it.s) {
		return 0, false
	}
	if c := it.s[it.i]; c < utf8.RuneSelf {
		it.i++
		return rune(c), true
	}
	r, size := decodeWTF8(it.s[it.i:])
	it.i += size
	if r > 0xFFFF {
		r1, r2 := utf16.EncodeRune(r)
		it.pending = r2
		return r1, true
	}
	return r, true
}

// encoder serializes parsed nodes.
type encoder struct {
	sorted      bool // canonical: keys sorted (then JS index hoisting)
	ascii       bool // Python ensure_ascii style strings, literal numbers, wire order
	dropTopKey  string
	forbidProto bool
}

var errProtoKey = errors.New(`key "__proto__" cannot be canonicalized (JavaScript drops it)`)

func (e *encoder) appendNode(b []byte, n *node, top bool) ([]byte, error) {
	var err error
	switch n.kind {
	case kindNull:
		b = append(b, "null"...)
	case kindTrue:
		b = append(b, "true"...)
	case kindFalse:
		b = append(b, "false"...)
	case kindNumber:
		if e.ascii {
			b = append(b, n.str...)
		} else {
			b = appendJSNumber(b, n.num)
		}
	case kindString:
		b = e.appendString(b, n.str)
	case kindArray:
		b = append(b, '[')
		for i, el := range n.elems {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = e.appendNode(b, el, false); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	case kindObject:
		b = append(b, '{')
		var order []int
		if e.ascii {
			order = make([]int, len(n.keys))
			for i := range order {
				order[i] = i
			}
		} else {
			order = jsOrder(n.keys, e.sorted)
		}
		first := true
		for _, i := range order {
			k := n.keys[i]
			if top && e.dropTopKey != "" && k == e.dropTopKey {
				continue
			}
			if e.forbidProto && k == "__proto__" {
				return nil, errProtoKey
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = e.appendString(b, k)
			b = append(b, ':')
			if b, err = e.appendNode(b, n.elems[i], false); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	return b, nil
}

func (e *encoder) appendString(b []byte, s string) []byte {
	if e.ascii {
		return appendASCIIString(b, s)
	}
	return appendJSString(b, s)
}

// JSStringify returns the bytes JavaScript's JSON.stringify(JSON.parse(raw)) produces, encoded as
// UTF-8: members in JavaScript's enumeration order (array-index keys first, ascending; then first
// occurrence order; a duplicate key's last value wins at the first key's position), strings as raw
// UTF-8 with only '"', '\\' and control characters escaped (lone surrogates as \udxxx), numbers as
// JavaScript formats a Number. Invalid JSON, nesting deeper than MaxJSONDepth and texts larger than
// MaxJSONBytes are errors.
func JSStringify(raw []byte) ([]byte, error) {
	n, err := parseJSON(raw)
	if err != nil {
		return nil, err
	}
	e := encoder{}
	return e.appendNode(make([]byte, 0, len(raw)), n, true)
}

// CanonicalJSON returns the bytes JavaScript produces for JSON.stringify(deepSortKeys(JSON.parse(raw))),
// the canonical form beam/1 uses for result frames and signed agent mutations: every object's keys are
// sorted by UTF-16 code units and re-inserted into a fresh object, so array-index keys still come first in
// numeric order; values are formatted as in JSStringify. A "__proto__" key is rejected, because
// JavaScript's re-insertion silently drops it and a signature would then not cover it.
func CanonicalJSON(raw []byte) ([]byte, error) {
	n, err := parseJSON(raw)
	if err != nil {
		return nil, err
	}
	e := encoder{sorted: true, forbidProto: true}
	return e.appendNode(make([]byte, 0, len(raw)), n, true)
}

// compactJSON removes insignificant whitespace from valid JSON, keeping every other byte as is.
func compactJSON(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	inStr, esc := false, false
	for _, c := range raw {
		if inStr {
			out = append(out, c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			inStr = true
		}
		out = append(out, c)
	}
	return out
}
