package registry

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// maxBodyBytes bounds every request body the registry reads.
const maxBodyBytes = 64 << 10

var errNonceReused = httpjson.Errorf(http.StatusConflict, "NONCE_REUSED", "nonce was already used")

// fields is a decoded JSON object body. Unknown keys are ignored.
type fields map[string]json.RawMessage

// readBody reads a bounded body.
func readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, httpjson.Errorf(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "body exceeds %d bytes", maxBodyBytes)
		}
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_BODY", "cannot read body")
	}
	return body, nil
}

// decodeObject parses a JSON object body.
func decodeObject(body []byte) (fields, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_JSON", "body must be a JSON object")
	}
	if !json.Valid(body) {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_JSON", "body is not valid JSON")
	}
	var f fields
	if err := json.Unmarshal(body, &f); err != nil || f == nil {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_BODY", "body must be a JSON object")
	}
	return f, nil
}

// readObject reads and parses a bounded JSON object body.
func readObject(w http.ResponseWriter, req *http.Request) (fields, error) {
	body, err := readBody(w, req)
	if err != nil {
		return nil, err
	}
	return decodeObject(body)
}

// raw returns the first present, non-null value among names.
func (f fields) raw(names ...string) (json.RawMessage, string, bool) {
	for _, n := range names {
		v, ok := f[n]
		if ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return v, n, true
		}
	}
	return nil, "", false
}

// str reads an optional string field; a value of another type is an error
// with code.
func (f fields) str(code string, names ...string) (string, bool, error) {
	v, name, ok := f.raw(names...)
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false, httpjson.Errorf(http.StatusBadRequest, code, "%s must be a string", name)
	}
	return s, true, nil
}

// optStr reads an optional string field as a pointer (nil when absent).
func (f fields) optStr(code string, names ...string) (*string, error) {
	s, ok, err := f.str(code, names...)
	if err != nil || !ok {
		return nil, err
	}
	return &s, nil
}

// checkedStr reads an optional string field as a pointer (nil when absent)
// and validates a present value with check.
func (f fields) checkedStr(code string, check func(string) error, names ...string) (*string, error) {
	s, err := f.optStr(code, names...)
	if err != nil || s == nil {
		return nil, err
	}
	if err := check(*s); err != nil {
		return nil, err
	}
	return s, nil
}

// signed reads the timestamp, nonce and signature of a signed body.
func (f fields) signed() (proof, error) {
	var p proof
	var err error
	if p.timestamp, _, err = f.str("INVALID_TIMESTAMP", "timestamp"); err != nil {
		return p, err
	}
	if p.nonce, _, err = f.str("INVALID_NONCE", "nonce"); err != nil {
		return p, err
	}
	if p.signature, _, err = f.str("INVALID_SIGNATURE", "signature"); err != nil {
		return p, err
	}
	return p, nil
}

// proof is the freshness and signature triple of a signed request.
type proof struct {
	timestamp, nonce, signature string
}

// Field validators. Each returns an *httpjson.Error with the documented code.

func hasControl(s string) bool {
	for _, c := range s {
		if unicode.IsControl(c) {
			return true
		}
	}
	return false
}

func validateDisplayName(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" || utf8.RuneCountInString(s) > 128 || !utf8.ValidString(s) || hasControl(s) {
		return "", httpjson.Errorf(http.StatusBadRequest, "INVALID_DISPLAY_NAME", "displayName must be 1–128 printable characters")
	}
	return s, nil
}

func decodeCapabilities(f fields) ([]string, bool, error) {
	v, _, ok := f.raw("capabilities")
	if !ok {
		return nil, false, nil
	}
	var caps []string
	if err := json.Unmarshal(v, &caps); err != nil {
		return nil, false, httpjson.Errorf(http.StatusBadRequest, "INVALID_CAPABILITIES", "capabilities must be an array of strings")
	}
	if len(caps) > 64 {
		return nil, false, httpjson.Errorf(http.StatusBadRequest, "INVALID_CAPABILITIES", "at most 64 capabilities")
	}
	out := make([]string, 0, len(caps))
	seen := map[string]bool{}
	for _, c := range caps {
		c = strings.TrimSpace(c)
		if c == "" || len(c) > 128 || !utf8.ValidString(c) || hasControl(c) {
			return nil, false, httpjson.Errorf(http.StatusBadRequest, "INVALID_CAPABILITIES", "each capability must be 1–128 printable characters")
		}
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out, true, nil
}

func validateEmail(s string) error {
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || domain == "" || strings.Contains(domain, "@") || len(s) > 254 ||
		strings.ContainsAny(s, " \t\r\n<>") || hasControl(s) || !strings.Contains(domain, ".") {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_EMAIL", "email is not a valid address")
	}
	return nil
}

func validateWebURL(s, code, name string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || len(s) > 2048 || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || hasControl(s) {
		return httpjson.Errorf(http.StatusBadRequest, code, "%s must be an http(s) URL", name)
	}
	return nil
}

func validateVisibility(s string) error {
	if s != visibilityPublic && s != visibilityUnlisted {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_VISIBILITY", "visibility must be public or unlisted")
	}
	return nil
}

// validateEndpoint accepts https URLs, and http on loopback when allowed.
// ValidateEndpoint checks a URL the directory will send requests to by the
// rules of an agent's httpEndpoint: an https URL (http only on loopback
// when allowInsecure), no user info, at most 2048 bytes, no control
// characters. It returns the registry's INVALID_HTTP_ENDPOINT error.
func ValidateEndpoint(s string, allowInsecure bool) error { return validateEndpoint(s, allowInsecure) }

func validateEndpoint(s string, allowInsecure bool) error {
	if s == "" {
		return nil
	}
	bad := httpjson.Errorf(http.StatusBadRequest, "INVALID_HTTP_ENDPOINT", "httpEndpoint must be an https URL")
	u, err := url.Parse(s)
	if err != nil || len(s) > 2048 || u.Host == "" || u.User != nil || hasControl(s) {
		return bad
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if !allowInsecure {
			return bad
		}
		host := u.Hostname()
		if host == "localhost" {
			return nil
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return nil
		}
	}
	return bad
}

func validateDHKey(s string) error {
	if s == "" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(s) > 256 || len(b) < 32 || len(b) > 128 {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_DH_PUBLIC_KEY", "dhPublicKey must be a base64 X25519 public key")
	}
	return nil
}

func validateDescription(s string) error {
	if utf8.RuneCountInString(s) > 2000 || !utf8.ValidString(s) {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_DESCRIPTION", "description must be at most 2000 characters")
	}
	return nil
}

func validNonce(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// parseBeamID lowercases and validates a Beam ID from a path or body.
func parseBeamID(s string) (wire.BeamID, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || len(s) > 128 {
		return wire.BeamID{}, httpjson.Errorf(http.StatusBadRequest, "INVALID_BEAM_ID", "invalid Beam ID")
	}
	id, err := wire.ParseBeamID(s)
	if err != nil {
		return wire.BeamID{}, httpjson.Errorf(http.StatusBadRequest, "INVALID_BEAM_ID", "invalid Beam ID %q", truncate(s, 80))
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func isOrgLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// slugify turns a display name into an agent label.
func slugify(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_':
			b.WriteRune(c)
			dash = false
		default:
			if !dash && b.Len() > 0 {
				b.WriteByte('-')
				dash = true
			}
		}
		if b.Len() >= 48 {
			break
		}
	}
	out := strings.Trim(b.String(), "-")
	if out == "" {
		return "agent"
	}
	return out
}
