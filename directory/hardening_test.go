package directory

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
)

// signedConnectQuery is the query of a signed ws.connect token of a.
func signedConnectQuery(t *testing.T, a *agent, ts time.Time, nonce string) string {
	t.Helper()
	stamp := wire.FormatTimestamp(ts)
	sig, err := wire.SignCanonical(map[string]any{"action": connectAction, "beamId": a.id, "nonce": nonce, "timestamp": stamp}, a.priv)
	require.NoError(t, err)
	return "beamId=" + url.QueryEscape(a.id) + "&timestamp=" + url.QueryEscape(stamp) + "&nonce=" + url.QueryEscape(nonce) + "&signature=" + url.QueryEscape(sig)
}

// One agent that makes more signed connects than its nonce budget holds
// locks out only its own signed connects: another agent still connects.
func TestConnectNonceBudgetIsPerAgent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mallory, bob := b.register("mallory"), b.register("bob")
	for i := 0; i < maxConnectNoncesPerAgent; i++ {
		c, err := b.dial(signedConnectQuery(t, mallory, b.clock.Now(), "m-"+strconv.Itoa(i)), true)
		require.NoError(t, err)
		require.Equal(t, "connected", c.next().Type)
		_ = c.conn.CloseNow()
	}
	over, err := b.dial(signedConnectQuery(t, mallory, b.clock.Now(), "m-over"), true)
	require.NoError(t, err)
	code, reason := over.closeStatus()
	require.Equal(t, websocket.StatusPolicyViolation, code)
	require.Contains(t, reason, "too many signed connects")

	// Bob is not affected.
	b.connectQuery(bob, signedConnectQuery(t, bob, b.clock.Now(), "b-1"))
}

// A signed connect URL captured before a restart cannot be replayed after
// it, although the used-nonce table starts empty.
func TestConnectTokenNotReplayableAfterRestart(t *testing.T) {
	t.Parallel()
	first := setup(t)
	bob := first.register("bob")
	q := signedConnectQuery(t, bob, first.clock.Now(), "captured-1")
	first.connectQuery(bob, q)
	first.close()

	first.clock.Advance(time.Second)
	second := setup(t, func(o *setupOpts) { o.path, o.clock = first.path, first.clock })
	r, err := second.dial(q, true)
	require.NoError(t, err)
	code, reason := r.closeStatus()
	require.Equal(t, websocket.StatusPolicyViolation, code)
	require.Contains(t, reason, "before the directory started")

	// A token signed now is accepted.
	second.connectQuery(bob, signedConnectQuery(t, bob, second.clock.Now(), "fresh-1"))
}

// A validly signed intent with an empty or over-long intent, to or nonce
// is a client mistake: 400 INVALID_INTENT with the documented shape on
// HTTP (JSON and JWS) and WebSocket, never a 500, and nothing recorded.
func TestFieldLengthsAnswer400(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ac := b.connect(alice)
	long := strings.Repeat("n", 300)
	cases := map[string]func(f *wire.IntentFrame){
		"intent": func(f *wire.IntentFrame) { f.Intent = "" },
		"to":     func(f *wire.IntentFrame) { f.To = "" },
		"nonce":  func(f *wire.IntentFrame) { f.Nonce = long },
		"long intent": func(f *wire.IntentFrame) {
			f.Intent = strings.Repeat("i", 300)
		},
	}
	for name, mutate := range cases {
		f := wire.NewIntentFrame(alice.id, bob.id, "task.run", json.RawMessage(`{}`), b.clock.Now())
		mutate(f)
		require.NoError(t, wire.SignIntent(f, alice.priv), name)

		status, body := b.send(f)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", name, body)
		code, msg := errBody(t, body)
		require.Equal(t, CodeInvalidIntent, code, name)
		require.NotContains(t, msg, "record", name)

		tok, err := wire.SignIntentJWS(f, alice.priv)
		require.NoError(t, err)
		resp, err := http.Post(b.srv.URL+"/intents/send", "application/jose", strings.NewReader(tok))
		require.NoError(t, err)
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s jws: %s", name, data)

		ac.sendIntent(f)
		m := ac.next()
		require.Contains(t, string(m.raw), `"errorCode":"INVALID_INTENT"`, name)
		if f.Nonce != "" && len(f.Nonce) <= 256 {
			require.False(t, b.hasRow(f.Nonce), name)
		}
	}
}

// A signed frame whose payload names a key twice verifies, but a
// first-wins recipient would read another value than JSON.parse (which the
// signature covers): refused with 400 on HTTP and an error on WebSocket.
func TestDuplicateKeysRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	b.connect(bob)
	ac := b.connect(alice)
	f := b.frame(alice, bob.id, "payment.send", `{"amount":1000}`)
	raw := frameJSON(t, f)
	dup := bytes.Replace(raw, []byte(`{"amount":1000}`), []byte(`{"amount":1,"amount":1000}`), 1)
	require.NotEqual(t, raw, dup)

	status, body := b.postRaw(dup)
	require.Equal(t, http.StatusBadRequest, status, string(body))
	code, msg := errBody(t, body)
	require.Equal(t, CodeInvalidIntent, code)
	require.Contains(t, msg, "duplicate JSON object key")

	tok, err := wire.SignJWS(wire.TypIntentJWS, dup, alice.id, alice.priv)
	require.NoError(t, err)
	resp, err := http.Post(b.srv.URL+"/intents/send", "application/jose", strings.NewReader(tok))
	require.NoError(t, err)
	jwsBody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(jwsBody))
	require.Contains(t, string(jwsBody), "duplicate JSON object key")

	ac.write([]byte(`{"type":"intent","frame":` + string(dup) + `}`))
	m := ac.next()
	require.Contains(t, string(m.raw), `"errorCode":"INVALID_INTENT"`)
	require.Contains(t, string(m.raw), "duplicate JSON object key")
	require.False(t, b.hasRow(f.Nonce))
	_ = registry.EchoBeamID
}

// An agent whose endpoint points at an internal address (directly, or by a
// name that resolves to one) cannot make the directory fetch it: the
// delivery fails with a generic reason that names no address or transport
// error, and the internal server is never called.
func TestDirectHTTPRefusesPrivateAddresses(t *testing.T) {
	t.Parallel()
	var internalCalls atomic.Int32
	internal := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		internalCalls.Add(1)
		_, _ = w.Write([]byte(`{"secret":"metadata-token"}`))
	}))
	t.Cleanup(internal.Close)
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.HTTPClient = internal.Client(); c.AllowPrivateEndpoints = false }
	})
	alice := b.register("alice")
	port := internal.Listener.Addr().(*net.TCPAddr).Port
	for i, endpoint := range []string{
		internal.URL + "/latest/meta-data",
		"https://localhost:" + strconv.Itoa(port) + "/latest/meta-data",
		"https://[::ffff:127.0.0.1]:" + strconv.Itoa(port) + "/x",
		"https://127.0.0.1:1/closed-port",
	} {
		hook := b.register("hook-"+strconv.Itoa(i), map[string]any{"httpEndpoint": endpoint})
		f := b.frame(alice, hook.id, "task.delegate", `{}`)
		status, body := b.send(f)
		require.Equal(t, http.StatusBadGateway, status, "%s: %s", endpoint, body)
		code, msg := errBody(t, body)
		require.Equal(t, codeDirectHTTPFailed, code)
		require.Contains(t, msg, "endpoint address is not allowed", endpoint)
		for _, leak := range []string{"127.0.0.1", "localhost", "dial", "refused", "certificate", "metadata", strconv.Itoa(port)} {
			require.NotContains(t, string(body), leak, endpoint)
		}
		evs, err := b.log.Trace(t.Context(), f.Nonce)
		require.NoError(t, err)
		require.NotContains(t, string(evs[len(evs)-1].Details.Result), "127.0.0.1")
	}
	require.Zero(t, internalCalls.Load(), "the internal server must never be called")
}

// Redirects that leave the endpoint's host, or go from https to http, are
// not followed, so the answer of another server is never read back.
func TestDirectHTTPRefusesRedirects(t *testing.T) {
	t.Parallel()
	var internalCalls atomic.Int32
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		internalCalls.Add(1)
		_, _ = w.Write([]byte(`{"secret":"admin-panel"}`))
	}))
	t.Cleanup(internal.Close)
	var target atomic.Value
	endpoint := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/same-host" {
			_, _ = w.Write([]byte(`{"ok":"same host"}`))
			return
		}
		http.Redirect(w, r, target.Load().(string), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(endpoint.Close)
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.HTTPClient = endpoint.Client() } })
	alice := b.register("alice")
	hook := b.register("hook", map[string]any{"httpEndpoint": endpoint.URL + "/beam"})
	port := endpoint.Listener.Addr().(*net.TCPAddr).Port
	for _, to := range []string{
		internal.URL + "/admin",                                  // https → http, another host
		"https://localhost:" + strconv.Itoa(port) + "/same-host", // another host name
	} {
		target.Store(to)
		f := b.frame(alice, hook.id, "task.delegate", `{}`)
		status, body := b.send(f)
		require.Equal(t, http.StatusBadGateway, status, "%s: %s", to, body)
		require.Contains(t, string(body), "endpoint redirect refused")
		require.NotContains(t, string(body), "admin-panel")
	}
	require.Zero(t, internalCalls.Load())

	// A redirect on the same host and scheme is followed.
	target.Store(endpoint.URL + "/same-host")
	status, body := b.send(b.frame(alice, hook.id, "task.delegate", `{}`))
	require.Equal(t, http.StatusOK, status, string(body))
	require.Contains(t, string(body), "same host")
}

func TestPublicAddr(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"93.184.216.34": true, "2606:4700::1111": true, "8.8.8.8": true,
		"127.0.0.1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false,
		"169.254.169.254": false, "100.64.0.1": false, "0.0.0.0": false, "224.0.0.1": false,
		"255.255.255.255": false, "::1": false, "::": false, "fe80::1": false, "fd00::1": false,
		"ff02::1": false, "::ffff:127.0.0.1": false, "::ffff:169.254.169.254": false,
		"64:ff9b::a9fe:a9fe": false, "2002:7f00:1::": false, "::ffff:8.8.8.8": true,
	} {
		require.Equal(t, want, PublicAddr(netip.MustParseAddr(addr)), addr)
	}
}
