package registry

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/testclock"
)

const (
	operatorToken = "op-token"
	viewerToken   = "viewer-token"
)

// testBundle is one registry on a real log file behind a real HTTP server.
type testBundle struct {
	t     testing.TB
	path  string
	cfg   Config
	clock *testclock.Clock
	log   *tracing.Log
	reg   *Registry
	srv   *httptest.Server
}

func testOperatorAuth(req *http.Request) (string, bool) {
	switch req.Header.Get("Authorization") {
	case "Bearer " + operatorToken:
		return "operator", true
	case "Bearer " + viewerToken:
		return "viewer", true
	}
	return "", false
}

func setup(t testing.TB, opts ...func(*Config)) *testBundle {
	t.Helper()
	b := &testBundle{
		t:     t,
		path:  filepath.Join(t.TempDir(), "beam.db"),
		clock: testclock.New(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)),
	}
	b.cfg = Config{
		OperatorAuth:           testOperatorAuth,
		Clock:                  b.clock.Now,
		Logger:                 slog.New(slog.NewTextHandler(io.Discard, nil)),
		AllowInsecureEndpoints: true,
	}
	for _, o := range opts {
		o(&b.cfg)
	}
	b.open()
	t.Cleanup(b.close)
	return b
}

func (b *testBundle) open() {
	b.t.Helper()
	ctx := context.Background()
	lg, err := tracing.Open(ctx, tracing.Config{Path: b.path, Clock: b.clock.Now, Logger: b.cfg.Logger})
	require.NoError(b.t, err)
	reg, err := Open(ctx, lg, b.cfg)
	require.NoError(b.t, err)
	mux := http.NewServeMux()
	reg.Routes(mux)
	b.log, b.reg, b.srv = lg, reg, httptest.NewServer(mux)
}

func (b *testBundle) close() {
	if b.srv == nil {
		return
	}
	b.srv.Close()
	require.NoError(b.t, b.reg.Close(context.Background()))
	require.NoError(b.t, b.log.Close())
	b.srv, b.reg, b.log = nil, nil, nil
}

// reopen restarts the registry on the same file.
func (b *testBundle) reopen() {
	b.close()
	b.open()
}

type resp struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (r resp) str(key string) string {
	s, _ := r.body[key].(string)
	return s
}

// call sends a request; body is marshalled unless it is []byte or string.
func (b *testBundle) call(method, path string, body any, headers ...string) resp {
	b.t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(v)
	case string:
		rd = strings.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(b.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, b.srv.URL+path, rd)
	require.NoError(b.t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := b.srv.Client().Do(req)
	require.NoError(b.t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(b.t, err)
	out := resp{status: res.StatusCode, header: res.Header, raw: raw}
	if len(bytes.TrimSpace(raw)) > 0 && raw[0] == '{' {
		require.NoError(b.t, json.Unmarshal(raw, &out.body), string(raw))
	}
	return out
}

// requireErr asserts an error response.
func requireErr(t testing.TB, r resp, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.status, string(r.raw))
	require.Equal(t, code, r.str("errorCode"), string(r.raw))
	require.NotEmpty(t, r.str("error"), string(r.raw))
}

// identity is a test agent key pair.
type identity struct {
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
	pubB64 string
}

func newIdentity(t testing.TB) identity {
	t.Helper()
	pub, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	return identity{pub: pub, priv: priv, pubB64: wire.EncodePublicKey(pub)}
}

// agent is a registered test agent.
type agent struct {
	identity
	beamID string
	apiKey string
}

func (b *testBundle) register(beamID string, extra ...map[string]any) agent {
	b.t.Helper()
	id := newIdentity(b.t)
	body := map[string]any{"beamId": beamID, "displayName": "Agent " + beamID, "capabilities": []string{"chat"}, "publicKey": id.pubB64}
	for _, e := range extra {
		for k, v := range e {
			body[k] = v
		}
	}
	r := b.call("POST", "/agents/register", body)
	require.Equal(b.t, http.StatusCreated, r.status, string(r.raw))
	return agent{identity: id, beamID: beamID, apiKey: r.str("apiKey")}
}

func (b *testBundle) ts() string { return b.clock.Now().UTC().Format("2006-01-02T15:04:05.000Z") }

// sign signs obj (plus timestamp and nonce, added here) with priv and
// returns the body fields timestamp, nonce, signature merged into obj.
func (b *testBundle) sign(priv ed25519.PrivateKey, obj map[string]any, nonce string, body map[string]any) map[string]any {
	b.t.Helper()
	ts := b.ts()
	signed := map[string]any{"timestamp": ts, "nonce": nonce}
	for k, v := range obj {
		signed[k] = v
	}
	sig, err := wire.SignCanonical(signed, priv)
	require.NoError(b.t, err)
	out := map[string]any{"timestamp": ts, "nonce": nonce, "signature": sig}
	for k, v := range body {
		out[k] = v
	}
	return out
}

func esc(beamID string) string { return url.PathEscape(beamID) }

// dbString reads one string from the log's read pool.
func (b *testBundle) dbString(query string, args ...any) string {
	b.t.Helper()
	var s string
	require.NoError(b.t, b.log.ReadDB().Get(&s, query, args...))
	return s
}

func (b *testBundle) dbInt(query string, args ...any) int64 {
	b.t.Helper()
	var n int64
	require.NoError(b.t, b.log.ReadDB().Get(&n, query, args...))
	return n
}
