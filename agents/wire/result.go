package wire

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// ResultFrame is a beam/1 result. Payload and Raw hold bytes exactly as received.
type ResultFrame struct {
	V         string
	Success   bool
	Nonce     string
	Timestamp string
	Payload   json.RawMessage // nil when absent or null
	Error     string
	ErrorCode string
	Latency   *int64 // milliseconds, rounded; nil when absent
	Signature string // "" when unsigned
	Raw       json.RawMessage
}

func resultErr(field, format string, args ...any) *FrameError {
	return &FrameError{Code: CodeInvalidResult, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// DecodeResultFrame parses and shape-checks a beam/1 result frame: success is a boolean, nonce a
// non-empty string, timestamp a string; payload, error, errorCode, latency and signature are optional
// (null counts as absent) but typed when present (payload any JSON value, latency a finite number).
// Unknown fields are kept in Raw and covered by result signatures. Failures are *FrameError with Code
// CodeInvalidResult.
func DecodeResultFrame(data []byte) (*ResultFrame, error) {
	if len(data) > MaxFrameBytes {
		return nil, resultErr("", "frame is %d bytes, limit %d", len(data), MaxFrameBytes)
	}
	if !utf8.Valid(data) {
		return nil, resultErr("", "frame is not valid UTF-8")
	}
	root, dup, err := parseJSONDup(data)
	if err != nil {
		return nil, &FrameError{Code: CodeInvalidResult, Msg: "frame is not valid JSON", Err: err}
	}
	if dup != nil {
		return nil, &FrameError{Code: CodeInvalidResult, Msg: dup.Error(), Err: dup}
	}
	if root.kind != kindObject {
		return nil, resultErr("", "frame must be a JSON object")
	}
	raw := append(json.RawMessage(nil), data...)
	r := &ResultFrame{Raw: raw}
	present := func(key string) *node {
		v := root.member(key)
		if v == nil || v.kind == kindNull {
			return nil
		}
		return v
	}
	optString := func(key string) (string, error) {
		v := present(key)
		if v == nil {
			return "", nil
		}
		if v.kind != kindString {
			return "", resultErr(key, "must be a string")
		}
		return v.str, nil
	}
	switch v := root.member("success"); {
	case v != nil && v.kind == kindTrue:
		r.Success = true
	case v != nil && v.kind == kindFalse:
	default:
		return nil, resultErr("success", "must be a boolean")
	}
	if v := root.member("nonce"); v == nil || v.kind != kindString || v.str == "" {
		return nil, resultErr("nonce", "must be a non-empty string")
	} else {
		r.Nonce = v.str
	}
	if v := root.member("timestamp"); v == nil || v.kind != kindString {
		return nil, resultErr("timestamp", "must be a string")
	} else {
		r.Timestamp = v.str
	}
	if r.V, err = optString("v"); err != nil {
		return nil, err
	}
	if r.Error, err = optString("error"); err != nil {
		return nil, err
	}
	if r.ErrorCode, err = optString("errorCode"); err != nil {
		return nil, err
	}
	if r.Signature, err = optString("signature"); err != nil {
		return nil, err
	}
	if v := present("payload"); v != nil {
		r.Payload = raw[v.start:v.end]
	}
	if v := present("latency"); v != nil {
		if v.kind != kindNumber || math.IsInf(v.num, 0) || math.Abs(v.num) > 1<<53 {
			return nil, resultErr("latency", "must be a finite number")
		}
		l := int64(math.Round(v.num))
		r.Latency = &l
	}
	return r, nil
}

// ResultSigningInput returns the bytes a beam/1 result is signed over: CanonicalJSON of the frame
// object without its "signature" member; every other member, unknown ones included, is covered.
func ResultSigningInput(raw []byte) ([]byte, error) {
	n, err := parseJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("result signing input: %w", err)
	}
	if n.kind != kindObject {
		return nil, errors.New("result signing input: frame must be a JSON object")
	}
	e := encoder{sorted: true, forbidProto: true, dropTopKey: "signature"}
	out, err := e.appendNode(make([]byte, 0, len(raw)), n, true)
	if err != nil {
		return nil, fmt.Errorf("result signing input: %w", err)
	}
	return out, nil
}

// Verify checks the result's signature with pub over ResultSigningInput(r.Raw). Failures wrap
// ErrBadSignature; an unsigned result fails too.
func (r *ResultFrame) Verify(pub ed25519.PublicKey) error {
	msg, err := ResultSigningInput(r.Raw)
	if err != nil {
		return fmt.Errorf("result %q: %w: %w", r.Nonce, ErrBadSignature, err)
	}
	if err := VerifySignature(msg, r.Signature, pub); err != nil {
		return fmt.Errorf("result %q: %w", r.Nonce, err)
	}
	return nil
}

// SignResult signs a result frame given as a JSON object (any existing "signature" member is dropped)
// and returns the frame re-serialized as JavaScript would, with "signature" appended last.
func SignResult(fields []byte, priv ed25519.PrivateKey) ([]byte, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("sign result: private key is %d bytes", len(priv))
	}
	n, err := parseJSON(fields)
	if err != nil {
		return nil, fmt.Errorf("sign result: %w", err)
	}
	if n.kind != kindObject {
		return nil, errors.New("sign result: frame must be a JSON object")
	}
	canon := encoder{sorted: true, forbidProto: true, dropTopKey: "signature"}
	msg, err := canon.appendNode(nil, n, true)
	if err != nil {
		return nil, fmt.Errorf("sign result: %w", err)
	}
	js := encoder{dropTopKey: "signature"}
	out, err := js.appendNode(make([]byte, 0, len(fields)+120), n, true)
	if err != nil {
		return nil, fmt.Errorf("sign result: %w", err)
	}
	out = out[:len(out)-1] // reopen the object
	if len(out) > 1 {
		out = append(out, ',')
	}
	out = append(out, `"signature":`...)
	out = appendJSString(out, Sign(msg, priv))
	return append(out, '}'), nil
}

// Result describes a result frame to build; see Build.
type Result struct {
	Success   bool
	Nonce     string
	Payload   json.RawMessage // optional; must be a JSON object when set
	Error     string          // optional
	ErrorCode string          // optional
	Latency   *int64          // optional, milliseconds
}

// Build returns the result frame {v:"1", success, nonce, timestamp[, payload][, error][, errorCode]
// [, latency]} with now as its timestamp, in the field order the JavaScript SDK uses and serialized as
// JSON.stringify would (the payload re-encoded with JavaScript ordering and formatting). With a non-nil
// priv the frame is signed (signature appended); with nil it is returned unsigned.
func (res Result) Build(now time.Time, priv ed25519.PrivateKey) ([]byte, error) {
	if res.Nonce == "" {
		return nil, errors.New("build result: empty nonce")
	}
	b := make([]byte, 0, 128+len(res.Payload))
	b = append(b, `{"v":"1","success":`...)
	if res.Success {
		b = append(b, "true"...)
	} else {
		b = append(b, "false"...)
	}
	b = append(b, `,"nonce":`...)
	b = appendJSString(b, res.Nonce)
	b = append(b, `,"timestamp":`...)
	b = appendJSString(b, FormatTimestamp(now))
	if len(res.Payload) > 0 {
		p, err := parseJSON(res.Payload)
		if err != nil {
			return nil, fmt.Errorf("build result: payload: %w", err)
		}
		if p.kind != kindObject {
			return nil, errors.New("build result: payload must be a JSON object")
		}
		b = append(b, `,"payload":`...)
		js := encoder{}
		if b, err = js.appendNode(b, p, false); err != nil {
			return nil, fmt.Errorf("build result: payload: %w", err)
		}
	}
	if res.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSString(b, res.Error)
	}
	if res.ErrorCode != "" {
		b = append(b, `,"errorCode":`...)
		b = appendJSString(b, res.ErrorCode)
	}
	if res.Latency != nil {
		b = append(b, `,"latency":`...)
		b = appendJSNumber(b, float64(*res.Latency))
	}
	b = append(b, '}')
	if priv == nil {
		return b, nil
	}
	return SignResult(b, priv)
}

// FailureResult returns the unsigned failure frame the directory synthesizes for its own failures:
// {"v":"1","success":false,"nonce","timestamp","error","errorCode"[,"latency"]}.
func FailureResult(nonce, errorCode, message string, now time.Time, latency *int64) []byte {
	b := make([]byte, 0, 160+len(nonce)+len(message))
	b = append(b, `{"v":"1","success":false,"nonce":`...)
	b = appendJSString(b, nonce)
	b = append(b, `,"timestamp":`...)
	b = appendJSString(b, FormatTimestamp(now))
	b = append(b, `,"error":`...)
	b = appendJSString(b, message)
	b = append(b, `,"errorCode":`...)
	b = appendJSString(b, errorCode)
	if latency != nil {
		b = append(b, `,"latency":`...)
		b = appendJSNumber(b, float64(*latency))
	}
	return append(b, '}')
}

// IsAsyncAcceptance reports whether r is an asynchronous acceptance: a successful result whose payload
// carries "terminal": false (delivered and accepted, the real work still pending).
func IsAsyncAcceptance(r *ResultFrame) bool {
	if r == nil || !r.Success || len(r.Payload) == 0 {
		return false
	}
	n, err := parseJSON(r.Payload)
	if err != nil {
		return false
	}
	t := n.member("terminal")
	return t != nil && t.kind == kindFalse
}
