package httpjson

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// Write encodes v as the JSON body of a response with status. HTML characters
// are not escaped (the body is JSON, never markup) and the response is marked
// uncacheable. A value that cannot be encoded is a server fault: the client
// gets 500 INTERNAL_ERROR instead of a truncated body.
func Write(w http.ResponseWriter, status int, v any) {
	writeType(w, status, "application/json", v)
}

// writeType is Write with another JSON media type (e.g. application/did+json).
func writeType(w http.ResponseWriter, status int, contentType string, v any) {
	b, err := encode(v)
	if err != nil {
		status, contentType = http.StatusInternalServerError, "application/json"
		b = []byte(internalBody)
	}
	WriteRaw(w, status, contentType, b)
}

const internalBody = `{"error":"internal error","errorCode":"INTERNAL_ERROR"}` + "\n"

// encode is v as Write sends it: HTML not escaped, a newline at the end.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return buf.Bytes(), err
}

// WriteRaw writes body, which must already be JSON, with status.
func WriteRaw(w http.ResponseWriter, status int, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Bearer returns the token of an "Authorization: Bearer <token>" header. The
// scheme is matched case-insensitively (RFC 9110) and surrounding spaces are
// trimmed; ok is false when there is no non-empty bearer token.
func Bearer(r *http.Request) (token string, ok bool) {
	h := r.Header.Get("Authorization")
	const scheme = "bearer "
	if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	token = strings.TrimSpace(h[len(scheme):])
	return token, token != ""
}

// apiKeyPrefix starts every agent API key.
const apiKeyPrefix = "bk_"

// APIKey returns an agent API key carried by r: the x-api-key header, or a
// bearer token that starts with apiKeyPrefix.
func APIKey(r *http.Request) (key string, ok bool) {
	if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
		return k, true
	}
	if tok, ok := Bearer(r); ok && strings.HasPrefix(tok, apiKeyPrefix) {
		return tok, true
	}
	return "", false
}
