package jobs_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/internal/beamtest"
)

func TestMain(m *testing.M) { os.Exit(beamtest.Main(m)) }

const (
	mainKey     = "main-secret-key"
	adminSecret = "admin-secret"
	dashPass    = "dash-pass"
	metricsTok  = "metrics-token"
)

// bus is a running beam serve with its Intent Protocol listener.
type bus struct {
	p *beamtest.Process
}

func baseEnv(extra ...string) []string {
	return append([]string{"BUS_SECRET=" + mainKey, "BUS_ADMIN_SECRET=" + adminSecret,
		"DASHBOARD_PASSWORD=" + dashPass, "BUS_METRICS_TOKEN=" + metricsTok,
		"BEAM_INTENT_CLAIM_TIMEOUT=2s"}, extra...)
}

func startBus(t *testing.T, env ...string) *bus {
	t.Helper()
	p := beamtest.Start(t, beamtest.Options{Env: baseEnv(env...)})
	require.NotEmpty(t, p.IntentURL())
	return &bus{p: p}
}

func (b *bus) url() string { return b.p.IntentURL() }

// client speaks the protocol with one API key, signing like the Python
// SDK 2.1.2 when sign is set.
type client struct {
	t      testing.TB
	base   func() string
	key    string
	sign   bool
	header http.Header
}

func (b *bus) client(t testing.TB, key string) *client {
	return &client{t: t, base: b.url, key: key, sign: true}
}

// resp is an answer.
type resp struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (r *resp) code() string {
	e, _ := r.body["error"].(map[string]any)
	if e == nil {
		return ""
	}
	c, _ := e["code"].(string)
	return c
}

// message is the error's message.
func (r *resp) message() string {
	e, _ := r.body["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

func (r *resp) str(k string) string {
	s, _ := r.body[k].(string)
	return s
}

func (r *resp) num(k string) float64 {
	f, _ := r.body[k].(float64)
	return f
}

func nonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sdkBody encodes like json.dumps(obj, sort_keys=True, separators=(',',':')).
func sdkBody(v any) []byte {
	if v == nil {
		return nil
	}
	if b, ok := v.([]byte); ok {
		return b
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// sdkQuery encodes a query as the SDK signs it: sorted by key, quote(safe=”).
func sdkQuery(q [][2]string) string {
	sort.SliceStable(q, func(i, j int) bool { return q[i][0] < q[j][0] })
	var parts []string
	for _, kv := range q {
		parts = append(parts, jobs.Quote(kv[0])+"="+jobs.Quote(kv[1]))
	}
	return strings.Join(parts, "&")
}

func (c *client) do(method, path string, query [][2]string, body any, hdr ...string) *resp {
	c.t.Helper()
	raw := sdkBody(body)
	q := sdkQuery(query)
	u := c.base() + (&url.URL{Path: path}).EscapedPath()
	if q != "" {
		u += "?" + q
	}
	req, err := http.NewRequest(method, u, bytes.NewReader(raw))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("X-API-KEY", c.key)
	}
	if c.sign && c.key != "" {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		n := nonce()
		p := path
		if q != "" {
			p += "?" + q
		}
		msg := strings.ToUpper(method) + "\n" + p + "\n" + ts + "\n" + n + "\n" + string(raw)
		req.Header.Set("X-Timestamp", ts)
		req.Header.Set("X-Nonce", n)
		req.Header.Set("X-Signature", jobs.Sign(c.key, msg))
	}
	for k, vs := range c.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return send(c.t, req)
}

func send(t testing.TB, req *http.Request) *resp {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	r := &resp{status: res.StatusCode, header: res.Header, raw: b}
	if len(b) > 0 && b[0] == '{' {
		require.NoError(t, json.Unmarshal(b, &r.body), string(b))
	}
	requireHeaders(t, res.Header)
	if res.StatusCode >= 400 {
		require.NotEmpty(t, r.code(), "error without the RFC §11 shape: %d %s", res.StatusCode, b)
		e := r.body["error"].(map[string]any)
		require.NotEmpty(t, e["message"])
		require.Len(t, r.body, 1)
	}
	return r
}

// requireHeaders checks the RFC §10 headers.
func requireHeaders(t testing.TB, h http.Header) {
	t.Helper()
	require.Equal(t, "DENY", h.Get("X-Frame-Options"))
	require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
	require.Equal(t, "no-referrer", h.Get("Referrer-Policy"))
	require.Equal(t, "no-store", h.Get("Cache-Control"))
	require.Equal(t, "2.1", h.Get("X-Intent-Version"))
}

// admin sends an admin request with X-Admin-Token.
func (b *bus) admin(t testing.TB, method, path string, body any) *resp {
	t.Helper()
	req, err := http.NewRequest(method, b.url()+path, bytes.NewReader(sdkBody(body)))
	require.NoError(t, err)
	req.Header.Set("X-Admin-Token", adminSecret)
	return send(t, req)
}

func (c *client) publish(body map[string]any) *resp {
	c.t.Helper()
	return c.do("POST", "/intent", nil, body)
}

// publishOK publishes and returns the id.
func (c *client) publishOK(body map[string]any) string {
	c.t.Helper()
	r := c.publish(body)
	require.Equal(c.t, http.StatusCreated, r.status, string(r.raw))
	require.Equal(c.t, "published", r.str("status"))
	require.Len(c.t, r.str("id"), 32)
	return r.str("id")
}

func (c *client) claim(ns string, extra ...[2]string) *resp {
	c.t.Helper()
	return c.do("POST", "/claim", append([][2]string{{"namespace", ns}}, extra...), nil)
}

// newKey makes a tester key.
func (b *bus) newKey(t testing.TB, owner string) string {
	t.Helper()
	r := b.admin(t, "POST", "/admin/generate_key", map[string]any{"owner": owner})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	k := r.str("api_key")
	require.True(t, strings.HasPrefix(k, "tk_"))
	return k
}

func uniqueNS(t testing.TB) string {
	return "ns-" + nonce()[:12]
}

func signMsg(key, msg string) string { return jobs.Sign(key, msg) }

func (r *resp) err() error {
	if r.status >= 400 {
		return &httpErr{r}
	}
	return nil
}

type httpErr struct{ r *resp }

func (e *httpErr) Error() string { return strconv.Itoa(e.r.status) + " " + string(e.r.raw) }

// nopT lets load goroutines use client without failing the test on a
// dropped connection (the process is being killed).
type nopT struct{ testing.TB }

// try is do for load loops: a transport error reports ok=false.
func (c *client) try(method, path string, query [][2]string, body any) (r *resp, ok bool) {
	defer func() {
		if p := recover(); p != nil {
			r, ok = nil, false
		}
	}()
	return c.do(method, path, query, body), true
}

func (n nopT) Helper() {}

func (n nopT) Errorf(format string, args ...any) { panic("request failed") }

func (n nopT) FailNow() { panic("request failed") }
