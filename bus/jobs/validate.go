package jobs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/beamdir/beam/internal/httpjson"
)

var (
	namespaceRe = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,64}$`)
	workerRe    = regexp.MustCompile(`^[a-zA-Z0-9_.:-]{1,64}$`)
)

// maxDepth bounds the nesting of payloads, results and KV values.
const maxDepth = 32

// fields is a decoded JSON object body.
type fields map[string]json.RawMessage

// decodeObject parses a request body as a JSON object. An empty body is
// an empty object.
func decodeObject(body []byte) (fields, *httpjson.Error) {
	t := bytes.TrimSpace(body)
	if len(t) == 0 {
		return fields{}, nil
	}
	if !json.Valid(t) {
		return nil, httpjson.New(http.StatusBadRequest, "invalid_json", "Request body is not valid JSON.")
	}
	if t[0] != '{' {
		return nil, httpjson.New(http.StatusBadRequest, "invalid_request", "Request body must be a JSON object.")
	}
	var f fields
	if err := json.Unmarshal(t, &f); err != nil {
		return nil, httpjson.New(http.StatusBadRequest, "invalid_json", "Request body is not valid JSON.")
	}
	return f, nil
}

// has reports whether the field is present and not null.
func (f fields) has(k string) bool {
	v, ok := f[k]
	return ok && string(v) != "null"
}

func invalid(field, msg string) *httpjson.Error {
	return httpjson.New(http.StatusBadRequest, "invalid_"+field, msg)
}

// str reads an optional string field (null or absent: "", false).
func (f fields) str(k string) (string, bool, *httpjson.Error) {
	if !f.has(k) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(f[k], &s); err != nil {
		return "", false, invalid(k, fmt.Sprintf("%s must be a string.", k))
	}
	return s, true, nil
}

// integer reads an optional integer field within [lo, hi].
func (f fields) integer(k string, def, lo, hi int) (int, *httpjson.Error) {
	if !f.has(k) {
		return def, nil
	}
	raw := bytes.TrimSpace(f[k])
	var n json.Number
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) ||
		json.Unmarshal(raw, &n) != nil || bytes.ContainsAny(raw, ".eE") {
		return 0, invalid(k, fmt.Sprintf("%s must be an integer from %d to %d.", k, lo, hi))
	}
	v, err := n.Int64()
	if err != nil || v < int64(lo) || v > int64(hi) {
		return 0, invalid(k, fmt.Sprintf("%s must be an integer from %d to %d.", k, lo, hi))
	}
	return int(v), nil
}

// number reads an optional number field within [lo, hi].
func (f fields) number(k string, def, lo, hi float64) (float64, *httpjson.Error) {
	if !f.has(k) {
		return def, nil
	}
	var v float64
	if err := json.Unmarshal(f[k], &v); err != nil || math.IsNaN(v) || v < lo || v > hi {
		return 0, invalid(k, fmt.Sprintf("%s must be a number from %g to %g.", k, lo, hi))
	}
	return v, nil
}

// compactValue compacts a JSON value and checks its size and depth.
func compactValue(raw json.RawMessage, field, tooLarge string) ([]byte, *httpjson.Error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, invalid(field, fmt.Sprintf("%s is not valid JSON.", field))
	}
	if depth(b.Bytes()) > maxDepth {
		return nil, httpjson.New(http.StatusBadRequest, "invalid_payload", fmt.Sprintf("%s is nested deeper than %d levels.", field, maxDepth))
	}
	if b.Len() > maxPayload {
		return nil, httpjson.New(http.StatusRequestEntityTooLarge, tooLarge,
			fmt.Sprintf("The '%s' field's serialized content exceeds the 7KB limit.", field))
	}
	return b.Bytes(), nil
}

// depth is the maximum nesting of arrays and objects in compact JSON.
func depth(b []byte) int {
	d, m := 0, 0
	in := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if in {
			if c == '\\' {
				i++
			} else if c == '"' {
				in = false
			}
			continue
		}
		switch c {
		case '"':
			in = true
		case '{', '[':
			d++
			m = max(m, d)
		case '}', ']':
			d--
		}
	}
	return m
}

// parsePublish validates a POST /intent body against RFC §4.1: every field
// rule has its own invalid_<field> error; nothing is coerced or clamped.
func parsePublish(f fields) (*publishReq, *httpjson.Error) {
	if !f.has("goal") || !f.has("payload") {
		return nil, httpjson.New(http.StatusBadRequest, "invalid_request", "Missing goal or payload.")
	}
	p := &publishReq{}
	var e *httpjson.Error
	var ok bool
	if p.goal, _, e = f.str("goal"); e != nil {
		return nil, e
	}
	if n := utf8.RuneCountInString(p.goal); n < 1 || n > 256 || strings.TrimSpace(p.goal) == "" {
		return nil, invalid("goal", "goal must be 1 to 256 characters.")
	}
	if p.payload, e = compactValue(f["payload"], "payload", "payload_too_large"); e != nil {
		return nil, e
	}
	if p.namespace, ok, e = f.str("namespace"); e != nil {
		return nil, invalid("namespace", "namespace must be a string.")
	} else if !ok {
		p.namespace = "default"
	}
	if !namespaceRe.MatchString(p.namespace) {
		return nil, invalid("namespace", "namespace must be 1 to 64 characters of letters, digits, '.', '-' and '_'.")
	}
	if p.visibility, ok, e = f.str("visibility"); e != nil {
		return nil, e
	} else if !ok {
		p.visibility = "private"
	}
	if p.visibility != "private" && p.visibility != "public" {
		return nil, invalid("visibility", `visibility must be "private" or "public".`)
	}
	if p.priority, e = f.integer("priority", 100, 0, 1000); e != nil {
		return nil, e
	}
	if p.delay, e = f.number("delay", 0, 0, intentTTL.Seconds()); e != nil {
		return nil, e
	}
	if p.maxAttempts, e = f.integer("max_attempts", 3, 1, 20); e != nil {
		return nil, e
	}
	if p.backoffBase, e = f.number("backoff_base", 5, 1, 3600); e != nil {
		return nil, e
	}
	if p.target, ok, e = f.str("target_worker"); e != nil {
		return nil, e
	} else if ok && !workerRe.MatchString(p.target) {
		return nil, invalid("target_worker", "target_worker must be 1 to 64 characters of letters, digits, '.', ':', '-' and '_'.")
	}
	if p.capability, ok, e = f.str("required_capability"); e != nil {
		return nil, e
	} else if ok && !workerRe.MatchString(p.capability) {
		return nil, invalid("required_capability", "required_capability must be 1 to 64 characters of letters, digits, '.', ':', '-' and '_'.")
	}
	return p, nil
}

// canonicalHash is the SHA-256 of a JSON body with object keys sorted and
// insignificant whitespace removed, so that semantically equal bodies
// compare equal.
func canonicalHash(body []byte) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		v = string(body)
	}
	b, err := json.Marshal(v)
	if err != nil {
		b = body
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// claimToken reads the required claim_token of a mutation.
func claimToken(f fields) (string, *httpjson.Error) {
	t, ok, e := f.str("claim_token")
	if e != nil {
		return "", invalid("claim_token", "claim_token must be a string.")
	}
	if !ok || t == "" {
		return "", httpjson.New(http.StatusBadRequest, "invalid_request", "Missing claim_token.")
	}
	return t, nil
}

// compactBuf is json.Compact (a seam the fuzz tests share).
func compactBuf(b *bytes.Buffer, raw []byte) error { return json.Compact(b, raw) }
