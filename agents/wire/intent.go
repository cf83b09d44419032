package wire

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Version is the beam/1 frame version carried in the "v" field.
const Version = "1"

// MaxFrameBytes bounds a frame the decoders accept. The directory applies its own, tighter ingress limit.
const MaxFrameBytes = 256 << 10

// MaxDeliverySize is the largest delivered frame (JSON.stringify length in UTF-8 bytes) that a
// beam-protocol-sdk 0.5.1 receiver accepts; larger frames are dropped silently by that SDK.
const MaxDeliverySize = 4096

// CodeInvalidIntent is the error code for intent frames that fail the shape checks.
const CodeInvalidIntent = "INVALID_INTENT"

// CodeInvalidResult is the error code for result frames that fail the shape checks.
const CodeInvalidResult = "INVALID_RESULT"

// FrameError is returned by the frame decoders. Code is the documented error code the server reports
// (CodeInvalidIntent or CodeInvalidResult); Field names the offending field when there is one.
type FrameError struct {
	Code  string
	Field string
	Msg   string
	Err   error
}

// Error implements error.
func (e *FrameError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", e.Code, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Msg)
}

// Unwrap returns the underlying error, if any.
func (e *FrameError) Unwrap() error { return e.Err }

// IntentFrame is a beam/1 intent. String fields hold decoded values; Payload and Raw hold bytes
// exactly as received.
type IntentFrame struct {
	V         string
	Intent    string
	From      string
	To        string
	Payload   json.RawMessage // the payload object, bytes as received (from "params" if UsedParams)
	Nonce     string
	Timestamp string
	Signature string          // base64 Ed25519 signature; "" when the frame carried none
	Raw       json.RawMessage // the whole frame as received; nil for frames built in Go

	// UsedParams reports that the sender carried the payload in the legacy "params" field.
	UsedParams bool

	members []rawMember // top-level members of Raw in order, duplicates resolved

	// parsed is the payload's parse tree from decoding, valid while Payload is still the slice it was
	// parsed from (parsedFrom); the tree is never modified, so copies of the frame share it.
	parsed     *node
	parsedFrom []byte
}

// rawMember is one top-level member of a received frame.
type rawMember struct {
	key string
	raw []byte
}

// Extra returns the raw bytes of a top-level field the frame carried besides the beam/1 fields, or nil.
func (f *IntentFrame) Extra(key string) json.RawMessage {
	switch key {
	case "v", "intent", "from", "to", "payload", "params", "nonce", "timestamp", "signature":
		return nil
	}
	for _, m := range f.members {
		if m.key == key {
			return json.RawMessage(m.raw)
		}
	}
	return nil
}

// Field length limits of an intent frame, in bytes. A Beam ID is at most 142 bytes
// (63 + "@" + 63 + ".beam.directory"); nonces are UUIDs in practice.
const (
	MaxBeamIDBytes = 256
	MaxIntentBytes = 256
	MaxNonceBytes  = 256
)

// checkFieldLengths refuses an intent whose from, to, intent or nonce is empty or too long, so that
// every entry path answers a client mistake with INVALID_INTENT before anything is recorded.
func checkFieldLengths(f *IntentFrame) *FrameError {
	for _, c := range []struct {
		name, val string
		max       int
	}{{"from", f.From, MaxBeamIDBytes}, {"to", f.To, MaxBeamIDBytes}, {"intent", f.Intent, MaxIntentBytes}, {"nonce", f.Nonce, MaxNonceBytes}} {
		if c.val == "" {
			return intentErr(c.name, "must not be empty")
		}
		if len(c.val) > c.max {
			return intentErr(c.name, "must be at most %d bytes", c.max)
		}
	}
	return nil
}

func intentErr(field, format string, args ...any) *FrameError {
	return &FrameError{Code: CodeInvalidIntent, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// DecodeIntentFrame parses and shape-checks a beam/1 intent frame: from, to and intent are strings;
// payload (or its legacy alias params) is an object; nonce and timestamp are non-empty strings;
// signature, when present, is a non-empty string. Unknown top-level fields are kept (for delivery) but
// otherwise ignored. The frame must be valid UTF-8 and at most MaxFrameBytes; the envelope strings must
// not contain lone surrogates. Failures are *FrameError with Code CodeInvalidIntent.
func DecodeIntentFrame(data []byte) (*IntentFrame, error) {
	if len(data) > MaxFrameBytes {
		return nil, intentErr("", "frame is %d bytes, limit %d", len(data), MaxFrameBytes)
	}
	if !utf8.Valid(data) {
		return nil, intentErr("", "frame is not valid UTF-8")
	}
	root, dup, err := parseJSONDup(data)
	if err != nil {
		return nil, &FrameError{Code: CodeInvalidIntent, Msg: "frame is not valid JSON", Err: err}
	}
	if dup != nil {
		return nil, &FrameError{Code: CodeInvalidIntent, Msg: dup.Error(), Err: dup}
	}
	if root.kind != kindObject {
		return nil, intentErr("", "frame must be a JSON object")
	}
	raw := append(json.RawMessage(nil), data...)
	f := &IntentFrame{Raw: raw}
	f.members = make([]rawMember, len(root.keys))
	for i, k := range root.keys {
		v := root.elems[i]
		f.members[i] = rawMember{key: k, raw: raw[v.start:v.end]}
	}

	str := func(field string, nonEmpty bool) (string, error) {
		v := root.member(field)
		if v == nil || v.kind != kindString {
			return "", intentErr(field, "must be a string")
		}
		if nonEmpty && v.str == "" {
			return "", intentErr(field, "must not be empty")
		}
		if hasLoneSurrogate(v.str) {
			return "", intentErr(field, "contains a lone surrogate")
		}
		return v.str, nil
	}
	if f.From, err = str("from", false); err != nil {
		return nil, err
	}
	if f.To, err = str("to", false); err != nil {
		return nil, err
	}
	if f.Intent, err = str("intent", false); err != nil {
		return nil, err
	}
	if f.Nonce, err = str("nonce", true); err != nil {
		return nil, err
	}
	if err := checkFieldLengths(f); err != nil {
		return nil, err
	}
	if f.Timestamp, err = str("timestamp", true); err != nil {
		return nil, err
	}
	if v := root.member("v"); v != nil && v.kind == kindString {
		f.V = v.str
	}
	switch p, q := root.member("payload"), root.member("params"); {
	case p != nil && p.kind == kindObject:
		f.Payload = raw[p.start:p.end]
		f.parsed = p
	case q != nil && q.kind == kindObject:
		f.Payload = raw[q.start:q.end]
		f.UsedParams = true
		f.parsed = q
	default:
		return nil, intentErr("payload", "must be an object")
	}
	if s := root.member("signature"); s != nil {
		if s.kind != kindString || s.str == "" {
			return nil, intentErr("signature", "must be a non-empty string when present")
		}
		f.Signature = s.str
	}
	f.parsedFrom = f.Payload
	return f, nil
}

// appendEnvelope builds {"type":"intent","from":…,"to":…,"intent":…,"payload":<payload>,
// "timestamp":…,"nonce":…} with the given string quoting.
func (f *IntentFrame) appendEnvelope(b []byte, quote func([]byte, string) []byte, payload []byte) []byte {
	b = append(b, `{"type":"intent","from":`...)
	b = quote(b, f.From)
	b = append(b, `,"to":`...)
	b = quote(b, f.To)
	b = append(b, `,"intent":`...)
	b = quote(b, f.Intent)
	b = append(b, `,"payload":`...)
	b = append(b, payload...)
	b = append(b, `,"timestamp":`...)
	b = quote(b, f.Timestamp)
	b = append(b, `,"nonce":`...)
	b = quote(b, f.Nonce)
	return append(b, '}')
}

// parsedPayload parses Payload and checks that it is an object.
func (f *IntentFrame) parsedPayload() (*node, error) {
	if n := f.decodedPayload(); n != nil {
		return n, nil
	}
	p := f.Payload
	if len(p) == 0 {
		p = json.RawMessage("{}")
	}
	n, err := parseJSON(p)
	if err != nil {
		return nil, fmt.Errorf("intent payload: %w", err)
	}
	if n.kind != kindObject {
		return nil, errors.New("intent payload: must be a JSON object")
	}
	return n, nil
}

// decodedPayload returns the payload's tree from decoding when Payload is still the slice it was
// parsed from, and nil otherwise. A decoded frame's payload passed the nesting and size limits inside
// the frame, which are stricter than those of the payload alone or inside the delivered frame.
func (f *IntentFrame) decodedPayload() *node {
	if f.parsed == nil || len(f.Payload) != len(f.parsedFrom) || len(f.Payload) == 0 || &f.Payload[0] != &f.parsedFrom[0] {
		return nil
	}
	return f.parsed
}

// PayloadJS returns JSStringify of the payload ({} when empty), from the tree the decoder built when
// the frame was decoded and its payload not replaced since.
func (f *IntentFrame) PayloadJS() ([]byte, error) {
	n, err := f.parsedPayload()
	if err != nil {
		return nil, err
	}
	e := encoder{}
	return e.appendNode(make([]byte, 0, len(f.Payload)), n, true)
}

// SigningInput returns the exact bytes a beam/1 intent is signed over: JavaScript's
// JSON.stringify({type:"intent", from, to, intent, payload, timestamp, nonce}) of the parsed frame. An
// empty Payload signs as {}.
func (f *IntentFrame) SigningInput() ([]byte, error) {
	payload, err := f.PayloadJS()
	if err != nil {
		return nil, err
	}
	return f.appendEnvelope(make([]byte, 0, len(payload)+256), appendJSString, payload), nil
}

// Verify checks the frame's signature with pub. It accepts a signature over (a) SigningInput, the form
// every JavaScript signer produces; (b) the same envelope with the payload as its compacted wire bytes;
// or (c) an ASCII-escaped form (non-ASCII as \uXXXX, payload numbers and key order as on the wire), which
// is what the Python SDK signs. Failures wrap ErrBadSignature.
func (f *IntentFrame) Verify(pub ed25519.PublicKey) error {
	sig, err := decodeSignature(f.Signature)
	if err != nil {
		return fmt.Errorf("intent %q: %w", f.Nonce, err)
	}
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("intent %q: %w: public key is %d bytes", f.Nonce, ErrBadSignature, len(pub))
	}
	payloadJS, err := f.PayloadJS()
	if err != nil {
		return fmt.Errorf("intent %q: %w: %w", f.Nonce, ErrBadSignature, err)
	}
	msgA := f.appendEnvelope(nil, appendJSString, payloadJS)
	if ed25519.Verify(pub, msgA, sig) {
		return nil
	}
	if len(f.Payload) > 0 {
		if compact := compactJSON(f.Payload); !bytes.Equal(compact, payloadJS) {
			if ed25519.Verify(pub, f.appendEnvelope(nil, appendJSString, compact), sig) {
				return nil
			}
		}
	}
	n, err := f.parsedPayload()
	if err != nil {
		return fmt.Errorf("intent %q: %w: %w", f.Nonce, ErrBadSignature, err)
	}
	py := encoder{ascii: true}
	if payloadPy, err := py.appendNode(nil, n, true); err == nil {
		msgC := f.appendEnvelope(nil, appendASCIIString, payloadPy)
		if !bytes.Equal(msgC, msgA) && ed25519.Verify(pub, msgC, sig) {
			return nil
		}
	}
	return fmt.Errorf("intent %q from %q: %w", f.Nonce, f.From, ErrBadSignature)
}

// SignIntent signs f with priv over its SigningInput and sets f.Signature.
func SignIntent(f *IntentFrame, priv ed25519.PrivateKey) error {
	if len(priv) != ed25519.PrivateKeySize {
		return fmt.Errorf("sign intent: private key is %d bytes", len(priv))
	}
	msg, err := f.SigningInput()
	if err != nil {
		return fmt.Errorf("sign intent: %w", err)
	}
	f.Signature = Sign(msg, priv)
	return nil
}

// DeliveryJSON returns the frame to forward to the recipient. For a received frame every top-level
// field is kept in its original position, extra fields with their bytes as received; the beam/1 fields
// are written from the struct (so a re-signed frame carries its new signature); "v" is "1"; "payload"
// carries the Payload bytes unchanged, and a legacy "params" is renamed to "payload". A frame built in
// Go is written as {v, intent, from, to, payload, nonce, timestamp, signature}.
func (f *IntentFrame) DeliveryJSON() ([]byte, error) {
	payload := []byte(f.Payload)
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	if !json.Valid(payload) {
		return nil, errors.New("delivery json: payload is not valid JSON")
	}
	b := make([]byte, 0, len(f.Raw)+len(payload)+64)
	b = append(b, '{')
	wrote := map[string]bool{}
	first := true
	field := func(key string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSString(b, key)
		b = append(b, ':')
		wrote[key] = true
	}
	known := func(key string) bool {
		switch key {
		case "v":
			field("v")
			b = appendJSString(b, Version)
		case "intent":
			field(key)
			b = appendJSString(b, f.Intent)
		case "from":
			field(key)
			b = appendJSString(b, f.From)
		case "to":
			field(key)
			b = appendJSString(b, f.To)
		case "nonce":
			field(key)
			b = appendJSString(b, f.Nonce)
		case "timestamp":
			field(key)
			b = appendJSString(b, f.Timestamp)
		case "signature":
			if f.Signature != "" {
				field(key)
				b = appendJSString(b, f.Signature)
			}
			wrote[key] = true
		case "payload":
			field(key)
			b = append(b, payload...)
		default:
			return false
		}
		return true
	}
	if len(f.members) == 0 {
		for _, k := range []string{"v", "intent", "from", "to", "payload", "nonce", "timestamp", "signature"} {
			known(k)
		}
	} else {
		if _, ok := f.member("v"); !ok {
			known("v")
		}
		for _, m := range f.members {
			key := m.key
			switch {
			case key == "params" && f.UsedParams:
				key = "payload"
			case key == "payload" && f.UsedParams:
				continue // not an object; the params bytes replace it
			}
			if wrote[key] {
				continue
			}
			if !known(key) {
				field(key)
				b = append(b, m.raw...)
			}
		}
		for _, k := range []string{"intent", "from", "to", "payload", "nonce", "timestamp", "signature"} {
			if !wrote[k] {
				known(k)
			}
		}
	}
	return append(b, '}'), nil
}

// quickDeliverySize is DeliverySize of d = f.DeliveryJSON() without parsing d again. When f carries no
// top-level member besides the beam/1 fields, every member DeliveryJSON writes is already in the form
// JSON.stringify gives it, except the payload: only the payload can change length. ok is false when
// that does not apply or the payload does not stringify; the full computation then decides.
func (f *IntentFrame) quickDeliverySize(d []byte) (n int, ok bool) {
	if len(d) > MaxJSONBytes || !utf8.Valid(d) {
		return 0, false
	}
	for _, m := range f.members {
		switch m.key {
		case "v", "intent", "from", "to", "payload", "nonce", "timestamp", "signature":
		case "params":
			if !f.UsedParams {
				return 0, false // delivered as an extra member
			}
		default:
			return 0, false
		}
	}
	payload := []byte(f.Payload)
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	root := f.decodedPayload()
	if root == nil {
		var err error
		root, _, err = parseAt(payload, 1) // the payload sits inside the delivered object
		if err != nil || root.kind != kindObject {
			return 0, false
		}
	}
	e := encoder{}
	js, err := e.appendNode(make([]byte, 0, len(payload)), root, true)
	if err != nil {
		return 0, false
	}
	return len(d) - len(payload) + len(js), true
}

func (f *IntentFrame) member(key string) ([]byte, bool) {
	for _, m := range f.members {
		if m.key == key {
			return m.raw, true
		}
	}
	return nil, false
}

// DeliverySize returns the size a JavaScript receiver measures for the delivered frame: the UTF-8 length
// of JSON.stringify of DeliveryJSON. Compare it with MaxDeliverySize.
func (f *IntentFrame) DeliverySize() (int, error) {
	d, err := f.DeliveryJSON()
	if err != nil {
		return 0, err
	}
	if n, ok := f.quickDeliverySize(d); ok {
		return n, nil
	}
	s, err := JSStringify(d)
	if err != nil {
		return 0, fmt.Errorf("delivery size: %w", err)
	}
	return len(s), nil
}

// NewIntentFrame builds an unsigned frame with a random UUIDv4 nonce and now as its timestamp
// (UTC, millisecond precision, as JavaScript's toISOString writes it). A nil payload becomes {}.
func NewIntentFrame(from, to, intent string, payload json.RawMessage, now time.Time) *IntentFrame {
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	return &IntentFrame{
		V:         Version,
		Intent:    intent,
		From:      from,
		To:        to,
		Payload:   payload,
		Nonce:     NewNonce(),
		Timestamp: FormatTimestamp(now),
	}
}

// NewNonce returns a random RFC 4122 version 4 UUID string.
func NewNonce() string { return uuid.NewString() }

// FormatTimestamp writes t as JavaScript's Date.prototype.toISOString does: UTC with milliseconds.
func FormatTimestamp(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}
