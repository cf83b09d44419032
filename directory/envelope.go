package directory

import (
	"bytes"
	"encoding/json"

	"github.com/beamdir/beam/internal/jsonscan"
)

// This file splits a client WebSocket message {"type":…,"frame":…,"jws":…}
// into its members in one pass, with the accept/reject behaviour of
// decoding it with encoding/json into RawMessage fields:
//
//   - the message (after bytes.TrimSpace) must be a JSON object and the
//     whole text valid JSON, nested at most maxMessageDepth deep, or it is
//     errInvalidMessage;
//   - keys match "type", "frame" and "jws" the way encoding/json matches
//     struct fields (exactly, else case-insensitively), and the last of
//     duplicate keys wins;
//   - type and jws are their string values, "" when they are not strings;
//     a frame of null is absent.
//
// Every member is validated as it is scanned except an object or array
// frame: that is only skipped over (strings and brackets), because the
// frame decoders parse it fully anyway. A skipped frame is validated later
// only when it is not decoded (see wsEnvelope.validateFrame and
// decodeEnvelopeFrame), so a message that is not valid JSON is still
// errInvalidMessage before anything else happens.

// maxMessageDepth is encoding/json's nesting limit, the top-level object
// counting as one level: a deeper message is not valid JSON there, so it
// is not here either.
const maxMessageDepth = 10000

// wsEnvelope is a client message split into its members.
type wsEnvelope struct {
	Type  string
	Frame []byte // the frame's bytes within the message; nil when absent or null
	JWS   string
	// frameSkipped is set while Frame has only been skipped over, not
	// validated as JSON.
	frameSkipped bool
}

// envelope members a key can name.
const (
	memberOther = iota
	memberType
	memberFrame
	memberJWS
)

// scanWSMessage splits data into its type, frame and jws members. Its
// error is errInvalidMessage, and only for a message that encoding/json
// rejects too; a nil error leaves a skipped frame to validate (see
// validateFrame).
func scanWSMessage(data []byte) (wsEnvelope, error) {
	d := bytes.TrimSpace(data)
	if len(d) == 0 || d[0] != '{' {
		return wsEnvelope{}, errInvalidMessage
	}
	var (
		env             wsEnvelope
		typeRaw, jwsRaw []byte
	)
	i := jsonscan.SkipSpace(d, 1)
	if i < len(d) && d[i] == '}' {
		i++
	} else {
		for {
			i = jsonscan.SkipSpace(d, i)
			if i >= len(d) || d[i] != '"' {
				return wsEnvelope{}, errInvalidMessage
			}
			kend, escaped, nonASCII, ok := jsonscan.ScanString(d, i)
			plain := !escaped && !nonASCII
			if !ok {
				return wsEnvelope{}, errInvalidMessage
			}
			member := matchMember(d[i:kend], plain)
			i = jsonscan.SkipSpace(d, kend)
			if i >= len(d) || d[i] != ':' {
				return wsEnvelope{}, errInvalidMessage
			}
			i = jsonscan.SkipSpace(d, i+1)
			start := i
			if member == memberFrame && i < len(d) && (d[i] == '{' || d[i] == '[') {
				i, ok = skipComposite(d, i, 1)
			} else {
				i, ok = validValue(d, i, 1)
			}
			if !ok {
				return wsEnvelope{}, errInvalidMessage
			}
			switch member {
			case memberType:
				typeRaw = d[start:i]
			case memberJWS:
				jwsRaw = d[start:i]
			case memberFrame:
				// A frame overridden by a later one is never decoded:
				// validate it now.
				if err := env.validateFrame(); err != nil {
					return wsEnvelope{}, err
				}
				env.Frame = d[start:i]
				env.frameSkipped = d[start] == '{' || d[start] == '['
			}
			i = jsonscan.SkipSpace(d, i)
			if i >= len(d) {
				return wsEnvelope{}, errInvalidMessage
			}
			if d[i] == '}' {
				i++
				break
			}
			if d[i] != ',' {
				return wsEnvelope{}, errInvalidMessage
			}
			i++
		}
	}
	if jsonscan.SkipSpace(d, i) != len(d) {
		return wsEnvelope{}, errInvalidMessage
	}
	if string(env.Frame) == "null" {
		env.Frame = nil
	}
	env.Type = stringValue(typeRaw)
	env.JWS = stringValue(jwsRaw)
	return env, nil
}

// decodeWSMessage decodes {type, frame, jws} with every member validated.
// A message that is not a JSON object is errInvalidMessage; a type or jws
// that is not a string decodes as "". Frame is a slice of data.
func decodeWSMessage(data []byte) (wsMessage, error) {
	env, err := scanWSMessage(data)
	if err == nil {
		err = env.validateFrame()
	}
	if err != nil {
		return wsMessage{}, err
	}
	return wsMessage{Type: env.Type, Frame: env.Frame, JWS: env.JWS}, nil
}

// validateFrame checks a frame that was only skipped over: it is
// errInvalidMessage when the frame is not valid JSON (so neither is the
// message).
func (e *wsEnvelope) validateFrame() error {
	if !e.frameSkipped {
		return nil
	}
	if end, ok := validValue(e.Frame, 0, 1); !ok || end != len(e.Frame) {
		return errInvalidMessage
	}
	e.frameSkipped = false
	return nil
}

// decodeEnvelopeFrame decodes e's frame with decode. When decode fails on
// a frame that was only skipped over, the frame is validated first: its
// error is then errInvalidMessage when the message is not valid JSON, and
// decode's error otherwise. A frame decode succeeds only on valid JSON, so
// a decoded frame needs no second validation.
func decodeEnvelopeFrame[T any](e *wsEnvelope, decode func([]byte) (T, error)) (T, error) {
	v, err := decode(e.Frame)
	if err != nil {
		if verr := e.validateFrame(); verr != nil {
			var zero T
			return zero, verr
		}
		return v, err
	}
	e.frameSkipped = false
	return v, nil
}

// matchMember says which envelope member the key token k (quotes
// included) names. plain keys (ASCII, no escapes) are matched here, the
// way encoding/json matches field names: exactly, else ignoring ASCII
// case. Any other key is handed to encoding/json itself, so that escapes,
// invalid UTF-8 and Unicode case folding match exactly as they did.
func matchMember(k []byte, plain bool) int {
	if !plain {
		return matchMemberJSON(k)
	}
	name := k[1 : len(k)-1]
	switch {
	case foldEqualASCII(name, "type"):
		return memberType
	case foldEqualASCII(name, "frame"):
		return memberFrame
	case foldEqualASCII(name, "jws"):
		return memberJWS
	}
	return memberOther
}

// foldEqualASCII reports whether the ASCII key equals the lower-case
// name, ignoring the case of ASCII letters.
func foldEqualASCII(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := range len(key) {
		if c := key[i]; c != name[i] && c+('a'-'A') != name[i] {
			return false
		}
	}
	return true
}

// matchMemberJSON asks encoding/json which member the key token k names.
func matchMemberJSON(k []byte) int {
	var probe struct {
		Type  json.RawMessage `json:"type"`
		Frame json.RawMessage `json:"frame"`
		JWS   json.RawMessage `json:"jws"`
	}
	doc := make([]byte, 0, len(k)+4)
	doc = append(append(append(doc, '{'), k...), ":0}"...)
	if json.Unmarshal(doc, &probe) != nil {
		return memberOther
	}
	switch {
	case probe.Type != nil:
		return memberType
	case probe.Frame != nil:
		return memberFrame
	case probe.JWS != nil:
		return memberJWS
	}
	return memberOther
}

// stringValue is the string a validated JSON value raw decodes to, "" for
// a value that is not a string (or absent).
func stringValue(raw []byte) string {
	if len(raw) < 2 || raw[0] != '"' {
		return ""
	}
	inner := raw[1 : len(raw)-1]
	if _, escaped, nonASCII, _ := jsonscan.ScanString(raw, 0); escaped || nonASCII {
		var s string
		_ = json.Unmarshal(raw, &s)
		return s
	}
	switch string(inner) { // the common types without an allocation
	case "intent":
		return "intent"
	case "result":
		return "result"
	}
	return string(inner)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber validates the number starting at d[i] with JSON's grammar
// and returns the index after it.
func scanNumber(d []byte, i int) (int, bool) {
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return 0, false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return 0, false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return 0, false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	return i, true
}

// scanLiteral validates the literal word at d[i].
func scanLiteral(d []byte, i int, word string) (int, bool) {
	if len(d)-i < len(word) || string(d[i:i+len(word)]) != word {
		return 0, false
	}
	return i + len(word), true
}

// validValue validates the JSON value starting at d[i] (no leading
// whitespace), inside containers nested depth deep, and returns the index
// after it. It works without recursion; nesting beyond maxMessageDepth is
// invalid.
func validValue(d []byte, i, depth int) (int, bool) {
	var open []byte // containers opened by this value, innermost last
	var ok bool
	for {
		// A value starts at d[i].
		if i >= len(d) {
			return 0, false
		}
		switch c := d[i]; {
		case c == '{' || c == '[':
			if depth+len(open)+1 > maxMessageDepth {
				return 0, false
			}
			i = jsonscan.SkipSpace(d, i+1)
			if i < len(d) && d[i] == c+2 { // '{'+2 == '}', '['+2 == ']'
				i++
				break
			}
			open = append(open, c)
			if c == '{' {
				if i, ok = scanKey(d, i); !ok {
					return 0, false
				}
			}
			continue
		case c == '"':
			if i, _, _, ok = jsonscan.ScanString(d, i); !ok {
				return 0, false
			}
		case c == 't':
			if i, ok = scanLiteral(d, i, "true"); !ok {
				return 0, false
			}
		case c == 'f':
			if i, ok = scanLiteral(d, i, "false"); !ok {
				return 0, false
			}
		case c == 'n':
			if i, ok = scanLiteral(d, i, "null"); !ok {
				return 0, false
			}
		default:
			if i, ok = scanNumber(d, i); !ok {
				return 0, false
			}
		}
		// A value ended at i: close containers until one continues.
		for {
			if len(open) == 0 {
				return i, true
			}
			i = jsonscan.SkipSpace(d, i)
			if i >= len(d) {
				return 0, false
			}
			top := open[len(open)-1]
			if d[i] == top+2 {
				open = open[:len(open)-1]
				i++
				continue
			}
			if d[i] != ',' {
				return 0, false
			}
			i = jsonscan.SkipSpace(d, i+1)
			if top == '{' {
				if i, ok = scanKey(d, i); !ok {
					return 0, false
				}
			}
			break
		}
	}
}

// scanKey validates `"key" :` at d[i] and returns the index of the value
// after it (whitespace skipped).
func scanKey(d []byte, i int) (int, bool) {
	if i >= len(d) || d[i] != '"' {
		return 0, false
	}
	i, _, _, ok := jsonscan.ScanString(d, i)
	if !ok {
		return 0, false
	}
	i = jsonscan.SkipSpace(d, i)
	if i >= len(d) || d[i] != ':' {
		return 0, false
	}
	return jsonscan.SkipSpace(d, i+1), true
}

// skipComposite skips the object or array starting at d[i], inside
// containers nested depth deep, counting brackets outside strings without
// validating anything else, and returns the index after its closing
// bracket. On valid JSON that is the value's end; it fails only on text
// that is not valid JSON or nests beyond maxMessageDepth.
func skipComposite(d []byte, i, depth int) (int, bool) {
	n := 0 // brackets open
	for i < len(d) {
		switch d[i] {
		case '"':
			// The closing quote is the first one not escaped, i.e. not
			// preceded by an odd run of backslashes.
			j := i + 1
			for {
				q := bytes.IndexByte(d[j:], '"')
				if q < 0 {
					return 0, false
				}
				q += j
				b := q
				for b > j && d[b-1] == '\\' {
					b--
				}
				j = q + 1
				if (q-b)%2 == 0 {
					break
				}
			}
			i = j
			continue
		case '{', '[':
			n++
			if depth+n > maxMessageDepth {
				return 0, false
			}
		case '}', ']':
			n--
			if n == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return 0, false
}
