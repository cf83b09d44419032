package jobs

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
)

// principal is an authenticated API key.
type principal struct {
	key    string       // the key as presented (HMAC secret)
	digest string       // keyDigest(key)
	tester bool         // a key from /admin/generate_key (false: BUS_SECRET)
	nonce  *signedNonce // of a signed request
}

// authenticate checks X-API-KEY and, when present or required, the HMAC
// signature over the raw body.
func (s *Service) authenticate(r *http.Request, body []byte) (*principal, *httpjson.Error) {
	key := r.Header.Get("X-API-KEY")
	if key == "" {
		return nil, httpjson.New(http.StatusUnauthorized, "unauthorized", "Missing API key.")
	}
	p := &principal{key: key}
	if subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.Secret)) == 1 {
		p.digest = keyDigest(key)
	} else {
		h := hashHex(key)
		s.mu.Lock()
		_, ok := s.keys[h]
		s.mu.Unlock()
		if !ok {
			return nil, httpjson.New(http.StatusUnauthorized, "unauthorized", "Invalid API key.")
		}
		p.digest, p.tester = h[:32], true
	}
	sig := r.Header.Get("X-Signature")
	if sig == "" && !s.cfg.RequireSignatures {
		return p, nil
	}
	if e := s.verify(r, p, body, sig); e != nil {
		return nil, e
	}
	return p, nil
}

func sigErr(msg string) *httpjson.Error {
	return httpjson.New(http.StatusForbidden, "invalid_signature", msg)
}

// verify checks the signature headers of a request (RFC §5.2, as the
// Python SDK 2.1.2 signs).
func (s *Service) verify(r *http.Request, p *principal, body []byte, sig string) *httpjson.Error {
	ts, nonce := r.Header.Get("X-Timestamp"), r.Header.Get("X-Nonce")
	if sig == "" || ts == "" || nonce == "" {
		return sigErr("Signed requests need X-Timestamp, X-Nonce and X-Signature.")
	}
	if len(nonce) > 128 {
		return sigErr("X-Nonce is longer than 128 characters.")
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return sigErr("X-Timestamp must be an integer number of seconds.")
	}
	now := s.clock()
	if d := now.Unix() - t; d > int64(signatureWindow/time.Second) || d < -int64(signatureWindow/time.Second) {
		return sigErr("X-Timestamp is outside the accepted window of 300 seconds.")
	}
	want := Sign(p.key, CanonicalString(r.Method, r.URL.Path, r.URL.RawQuery, ts, nonce, body))
	got := strings.ToLower(sig)
	if !hmac.Equal([]byte(got), []byte(want)) {
		return sigErr("Signature does not match.")
	}
	expires := now.Add(2 * signatureWindow).Unix()
	if !s.nonces.Use(p.digest+"\x00"+nonce, now, time.Unix(expires, 0)) {
		// The reference's words: clients match on them.
		return sigErr("Replay detected")
	}
	// Stored before the answer (nonces.go), so that a replay stays refused
	// after a restart.
	p.nonce = &signedNonce{digest: p.digest, nonce: nonce, expires: expires}
	return nil
}

// Sign returns the lowercase hex HMAC-SHA256 of msg keyed with key.
func Sign(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// CanonicalString is the signed message of RFC §5.2: METHOD, the decoded
// path with the canonical query, the timestamp, the nonce and the raw body,
// joined by newlines. The query is parsed from rawQuery, stably sorted by
// key (repeated keys and blank values kept) and each key and value encoded
// as RFC 3986 (Python's quote(safe="")).
func CanonicalString(method, path, rawQuery, ts, nonce string, body []byte) string {
	var b strings.Builder
	b.Grow(len(method) + len(path) + len(rawQuery) + len(ts) + len(nonce) + len(body) + 8)
	b.WriteString(strings.ToUpper(method))
	b.WriteByte('\n')
	b.WriteString(path)
	if q := canonicalQuery(rawQuery); q != "" {
		b.WriteByte('?')
		b.WriteString(q)
	}
	b.WriteByte('\n')
	b.WriteString(ts)
	b.WriteByte('\n')
	b.WriteString(nonce)
	b.WriteByte('\n')
	b.Write(body)
	return b.String()
}

// canonicalQuery re-encodes a raw query string for signing.
func canonicalQuery(rawQuery string) string {
	if rawQuery == "" {
		return ""
	}
	type kv struct{ k, v string }
	var pairs []kv
	for part := range strings.SplitSeq(rawQuery, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		k = unescapeQuery(k)
		v = unescapeQuery(v)
		pairs = append(pairs, kv{k, v})
	}
	slices.SortStableFunc(pairs, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(Quote(p.k))
		b.WriteByte('=')
		b.WriteString(Quote(p.v))
	}
	return b.String()
}

func unescapeQuery(s string) string {
	u, err := url.QueryUnescape(s)
	if err != nil {
		return s
	}
	return u
}

// Quote percent-encodes every byte of s except the RFC 3986 unreserved
// characters (A–Z a–z 0–9 - . _ ~), with uppercase hex, like Python's
// urllib.parse.quote(s, safe="").
func Quote(s string) string {
	const hexUpper = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexUpper[c>>4])
		b.WriteByte(hexUpper[c&15])
	}
	return b.String()
}

// rateWindow is a fixed one-minute request window of a tester key.
type rateWindow struct {
	start int64 // unix s
	count int
}

// allow counts a request of a tester key and returns 0, or the seconds to
// wait when the key is over its limit.
func (s *Service) allow(p *principal) int {
	if !p.tester {
		return 0
	}
	now := s.clock().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.rates[p.digest]
	if w == nil || now-w.start >= 60 {
		w = &rateWindow{start: now}
		s.rates[p.digest] = w
	}
	if w.count >= s.cfg.RateLimit {
		return int(max(1, w.start+60-now))
	}
	w.count++
	return 0
}

// admin checks admin credentials in the order of RFC §5.3: X-Admin-Token
// when BUS_ADMIN_SECRET is set, then Basic admin:DASHBOARD_PASSWORD. There
// is no fallback to BUS_SECRET.
func (s *Service) admin(r *http.Request) bool {
	if s.cfg.AdminSecret != "" {
		if t := r.Header.Get("X-Admin-Token"); t != "" &&
			subtle.ConstantTimeCompare([]byte(t), []byte(s.cfg.AdminSecret)) == 1 {
			return true
		}
	}
	if s.cfg.DashboardPassword != "" {
		if u, pw, ok := r.BasicAuth(); ok && subtle.ConstantTimeCompare([]byte(u), []byte("admin")) == 1 &&
			subtle.ConstantTimeCompare([]byte(pw), []byte(s.cfg.DashboardPassword)) == 1 {
			return true
		}
	}
	return false
}

// secure reports whether r arrived over HTTPS (or from loopback, which
// BUS_ENFORCE_HTTPS exempts).
func (s *Service) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if s.cfg.TrustProxy && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if s.cfg.TrustProxy {
		if f := r.Header.Get("X-Forwarded-For"); f != "" {
			first, _, _ := strings.Cut(f, ",")
			ip = net.ParseIP(strings.TrimSpace(first))
		}
	}
	return ip != nil && ip.IsLoopback()
}
