package jsonfold

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/beamdir/beam/internal/jsonscan"
	"github.com/beamdir/beam/internal/tricks"
)

// On reports whether the trick is on: BEAM_TRICKS_OFF=details-fold (or
// all) turns it off, and callers then decode with encoding/json only.
var On = tricks.On("details-fold")

// ErrSlowPath is every Parser error: the text is outside the subset the
// parser decodes (or not JSON), and the caller decodes it with
// encoding/json, which decides.
var ErrSlowPath = errors.New("jsonfold: not in the fast subset")

// Parser reads one JSON text from the start. Every method consumes what it
// reads and answers ErrSlowPath for anything outside the subset it decodes;
// the caller then decodes the whole text with encoding/json.
type Parser struct {
	b string
	i int
}

// New returns a Parser of s.
func New(s string) Parser { return Parser{b: s} }

// ws skips whitespace.
func (p *Parser) ws() { p.i = jsonscan.SkipSpace(p.b, p.i) }

// End skips trailing whitespace and reports whether the text is consumed.
func (p *Parser) End() bool {
	p.ws()
	return p.i == len(p.b)
}

// Next skips whitespace and reports whether the next byte is c (consumed).
func (p *Parser) Next(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// Object walks a JSON object, calling field for each key (unescaped keys
// only).
func (p *Parser) Object(field func(key string) error) error {
	return p.List('{', '}', func() error {
		key, esc, err := p.stringSpan()
		if err != nil || esc {
			return ErrSlowPath
		}
		if !p.Next(':') {
			return ErrSlowPath
		}
		p.ws()
		return field(key)
	})
}

// List walks a JSON object or array delimited by open and closing,
// calling elem at the start of each member (after whitespace).
func (p *Parser) List(open, closing byte, elem func() error) error {
	if !p.Next(open) {
		return ErrSlowPath
	}
	if p.Next(closing) {
		return nil
	}
	for {
		p.ws()
		if err := elem(); err != nil {
			return err
		}
		if p.Next(',') {
			continue
		}
		if p.Next(closing) {
			return nil
		}
		return ErrSlowPath
	}
}

// stringSpan consumes a JSON string and returns its contents (still
// escaped) and whether it has escapes.
func (p *Parser) stringSpan() (string, bool, error) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false, ErrSlowPath
	}
	end, esc, _, ok := jsonscan.ScanString(p.b, p.i)
	if !ok {
		return "", false, ErrSlowPath
	}
	span := p.b[p.i+1 : end-1]
	p.i = end
	return span, esc, nil
}

// Str decodes a string value: valid UTF-8 and the one-character escapes;
// \u escapes go to the slow path.
func (p *Parser) Str() (string, error) {
	s, esc, err := p.stringSpan()
	if err != nil || !utf8.ValidString(s) {
		return "", ErrSlowPath
	}
	if !esc {
		return strings.Clone(s), nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		c, ok := jsonscan.Unescape(s[i])
		if !ok {
			return "", ErrSlowPath
		}
		out = append(out, c)
	}
	return string(out), nil
}

// Int decodes a plain JSON integer that fits bits.
func (p *Parser) Int(bits int) (int64, error) {
	start := p.i
	if err := p.number(); err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(p.b[start:p.i], 10, bits)
	if err != nil {
		return 0, ErrSlowPath // fractions, exponents, overflow: encoding/json decides
	}
	return v, nil
}

// Bool consumes true or false.
func (p *Parser) Bool() error {
	switch {
	case strings.HasPrefix(p.b[p.i:], "true"):
		p.i += 4
	case strings.HasPrefix(p.b[p.i:], "false"):
		p.i += 5
	default:
		return ErrSlowPath
	}
	return nil
}

// Raw returns a copy of a JSON value other than null.
func (p *Parser) Raw() ([]byte, error) {
	start := p.i
	if strings.HasPrefix(p.b[p.i:], "null") {
		return nil, ErrSlowPath
	}
	if err := p.Skip(); err != nil {
		return nil, err
	}
	return []byte(p.b[start:p.i]), nil
}

// Skip consumes and validates one JSON value.
func (p *Parser) Skip() error {
	return p.value(0)
}

// maxDepth bounds nesting on the fast path (encoding/json allows more;
// deeper input takes the slow path).
const maxDepth = 256

func (p *Parser) value(depth int) error {
	if depth > maxDepth || p.i >= len(p.b) {
		return ErrSlowPath
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, _, err := p.stringSpan()
		return err
	case c == '{':
		return p.List('{', '}', func() error {
			if _, _, err := p.stringSpan(); err != nil {
				return err
			}
			if !p.Next(':') {
				return ErrSlowPath
			}
			p.ws()
			return p.value(depth + 1)
		})
	case c == '[':
		return p.List('[', ']', func() error { return p.value(depth + 1) })
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	default:
		return p.number()
	}
}

func (p *Parser) literal(s string) error {
	if !strings.HasPrefix(p.b[p.i:], s) {
		return ErrSlowPath
	}
	p.i += len(s)
	return nil
}

// number consumes a JSON number (RFC 8259 grammar).
func (p *Parser) number() error {
	b, i := p.b, p.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return ErrSlowPath
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return ErrSlowPath
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return ErrSlowPath
		}
	}
	p.i = i
	return nil
}
