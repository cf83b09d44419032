package directory

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/testclock"

	"github.com/beamdir/beam/internal/apitest"
)

// testBundle is one directory under test: a real log in a temp dir, a real
// registry, the relay, and an httptest server carrying their routes.
type testBundle struct {
	t     testing.TB
	path  string
	clock *testclock.Clock
	log   *tracing.Log
	reg   *registry.Registry
	dir   *Directory
	srv   *httptest.Server

	closeOnce sync.Once
}

type setupOpts struct {
	cfg      func(*Config)
	listener func(net.Listener) net.Listener
	path     string
	clock    *testclock.Clock
	policy   registry.Policy
	domain   string // the registry's domain ("": its default)
}

func setup(t testing.TB, opts ...func(*setupOpts)) *testBundle {
	t.Helper()
	o := &setupOpts{}
	for _, fn := range opts {
		fn(o)
	}
	if o.path == "" {
		o.path = filepath.Join(t.TempDir(), "beam.db")
	}
	if o.clock == nil {
		o.clock = testclock.NewNow()
	}
	if o.policy == "" {
		o.policy = registry.PolicySameOrg
	}
	ctx := context.Background()
	lg, err := tracing.Open(ctx, tracing.Config{Path: o.path, Clock: o.clock.Now, Synchronous: "NORMAL"})
	require.NoError(t, err)
	// Relay tests put many agents in one org; org approval has its own tests.
	reg, err := registry.Open(ctx, lg, registry.Config{DefaultPolicy: o.policy, Clock: o.clock.Now, AllowInsecureEndpoints: true, OpenOrgs: true, Domain: o.domain})
	require.NoError(t, err)
	// Test endpoints are httptest servers on 127.0.0.1.
	cfg := Config{Log: lg, Registry: reg, Clock: o.clock.Now, AllowPrivateEndpoints: true}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	d, err := New(cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	reg.Routes(mux)
	d.Routes(mux)
	srv := httptest.NewUnstartedServer(mux)
	if o.listener != nil {
		srv.Listener = o.listener(srv.Listener)
	}
	srv.Start()
	b := &testBundle{t: t, path: o.path, clock: o.clock, log: lg, reg: reg, dir: d, srv: srv}
	t.Cleanup(b.close)
	return b
}

// close stops the directory, the server, the registry and the log, as a
// process exit would (idempotent).
func (b *testBundle) close() {
	b.closeOnce.Do(func() {
		b.srv.CloseClientConnections()
		_ = b.dir.Close()
		b.srv.Close()
		_ = b.reg.Close(context.Background())
		_ = b.log.Close()
	})
}

// agent is a registered agent with its keys.
type agent struct {
	id     string
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
	apiKey string
}

func (b *testBundle) register(name string, extra ...map[string]any) *agent {
	b.t.Helper()
	id := name
	if !strings.Contains(id, "@") {
		id = name + "@acme.beam.directory"
	}
	fields := map[string]any{}
	for _, e := range extra {
		maps.Copy(fields, e)
	}
	r := apitest.Register(b.t, b.srv.URL, id, name, fields)
	return &agent{id: r.ID, pub: r.Pub, priv: r.Priv, apiKey: r.APIKey}
}

// frame builds and signs an intent from a at the test clock's time.
func (b *testBundle) frame(a *agent, to, intent, payload string) *wire.IntentFrame {
	b.t.Helper()
	f := wire.NewIntentFrame(a.id, to, intent, json.RawMessage(payload), b.clock.Now())
	require.NoError(b.t, wire.SignIntent(f, a.priv))
	return f
}

func frameJSON(t testing.TB, f *wire.IntentFrame) []byte {
	t.Helper()
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	return raw
}

// postRaw posts body to /intents/send.
func (b *testBundle) postRaw(body []byte) (int, []byte) {
	b.t.Helper()
	resp, err := http.Post(b.srv.URL+"/intents/send", "application/json", bytes.NewReader(body))
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, data
}

func (b *testBundle) send(f *wire.IntentFrame) (int, []byte) {
	b.t.Helper()
	return b.postRaw(frameJSON(b.t, f))
}

// sendAsync posts f in the background; the outcome arrives on the channel.
func (b *testBundle) sendAsync(f *wire.IntentFrame) <-chan httpOutcome {
	body := frameJSON(b.t, f)
	ch := make(chan httpOutcome, 1)
	go func() {
		resp, err := http.Post(b.srv.URL+"/intents/send", "application/json", bytes.NewReader(body))
		if err != nil {
			ch <- httpOutcome{err: err}
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		ch <- httpOutcome{status: resp.StatusCode, body: data, err: err}
	}()
	return ch
}

type httpOutcome struct {
	status int
	body   []byte
	err    error
}

func waitHTTP(t *testing.T, ch <-chan httpOutcome) httpOutcome {
	t.Helper()
	select {
	case o := <-ch:
		require.NoError(t, o.err)
		return o
	case <-time.After(20 * time.Second):
		require.FailNow(t, "no HTTP response")
		return httpOutcome{}
	}
}

// states returns the states of a nonce's trace in order.
func (b *testBundle) states(nonce string) []tracing.State {
	b.t.Helper()
	return apitest.States(b.t, b.log, nonce)
}

func (b *testBundle) row(nonce string) tracing.IntentRow {
	b.t.Helper()
	r, ok, err := b.log.Intent(context.Background(), nonce)
	require.NoError(b.t, err)
	require.True(b.t, ok, "no intent_log row for %s", nonce)
	return r
}

func (b *testBundle) hasRow(nonce string) bool {
	b.t.Helper()
	_, ok, err := b.log.Intent(context.Background(), nonce)
	require.NoError(b.t, err)
	return ok
}

// wsMsg is a message a test client received.
type wsMsg struct {
	Type            string          `json:"type"`
	BeamID          string          `json:"beamId"`
	Auth            string          `json:"auth"`
	Frame           json.RawMessage `json:"frame"`
	SenderPublicKey string          `json:"senderPublicKey"`
	Nonce           string          `json:"nonce"`
	ErrorCode       string          `json:"errorCode"`
	Message         string          `json:"message"`
	raw             []byte
}

// wsClient is a real WebSocket client; a goroutine reads into msgs.
type wsClient struct {
	t      testing.TB
	a      *agent
	conn   *websocket.Conn
	msgs   chan wsMsg
	closed chan struct{}
	err    error // read error, valid after closed
}

func (b *testBundle) wsURL(query string) string {
	return "ws" + strings.TrimPrefix(b.srv.URL, "http") + "/ws?" + query
}

// dial opens a WebSocket with query; it does not wait for connected.
func (b *testBundle) dial(query string, readAll bool) (*wsClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, b.wsURL(query), nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(1 << 20)
	c := &wsClient{t: b.t, conn: conn, msgs: make(chan wsMsg, 4096), closed: make(chan struct{})}
	if readAll {
		go c.readLoop()
	}
	b.t.Cleanup(func() { _ = conn.CloseNow() })
	return c, nil
}

func (c *wsClient) readLoop() {
	defer close(c.closed)
	for {
		_, data, err := c.conn.Read(context.Background())
		if err != nil {
			c.err = err
			return
		}
		var m wsMsg
		if json.Unmarshal(data, &m) != nil {
			m.Type = "<invalid>"
		}
		m.raw = data
		c.msgs <- m
	}
}

// connect attaches a with its API key and waits for connected.
func (b *testBundle) connect(a *agent) *wsClient {
	b.t.Helper()
	return b.connectQuery(a, "beamId="+url.QueryEscape(a.id)+"&apiKey="+url.QueryEscape(a.apiKey))
}

func (b *testBundle) connectQuery(a *agent, query string) *wsClient {
	b.t.Helper()
	c, err := b.dial(query, true)
	require.NoError(b.t, err)
	c.a = a
	m := c.next()
	require.Equal(b.t, "connected", m.Type, string(m.raw))
	require.Equal(b.t, a.id, m.BeamID)
	require.Eventually(b.t, func() bool { return b.dir.Online(a.id) }, 5*time.Second, 5*time.Millisecond)
	return c
}

// next returns the next message (fails after 20 s).
func (c *wsClient) next() wsMsg {
	c.t.Helper()
	select {
	case m := <-c.msgs:
		return m
	case <-c.closed:
		select {
		case m := <-c.msgs:
			return m
		default:
		}
		require.FailNow(c.t, "connection closed", "err: %v", c.err)
	case <-time.After(20 * time.Second):
		require.FailNow(c.t, "no message within 20s")
	}
	return wsMsg{}
}

// nextOf returns the next message, which must have type typ.
func (c *wsClient) nextOf(typ string) wsMsg {
	c.t.Helper()
	m := c.next()
	require.Equal(c.t, typ, m.Type, "message: %s", m.raw)
	return m
}

// closeStatus waits for the connection to end and returns its close status.
func (c *wsClient) closeStatus() (websocket.StatusCode, string) {
	c.t.Helper()
	select {
	case <-c.closed:
	case <-time.After(20 * time.Second):
		require.FailNow(c.t, "connection not closed within 20s")
	}
	var ce websocket.CloseError
	if errors.As(c.err, &ce) {
		return ce.Code, ce.Reason
	}
	return websocket.CloseStatus(c.err), ""
}

func (c *wsClient) write(v any) {
	c.t.Helper()
	var data []byte
	switch x := v.(type) {
	case []byte:
		data = x
	case string:
		data = []byte(x)
	default:
		var err error
		data, err = json.Marshal(v)
		require.NoError(c.t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(c.t, c.conn.Write(ctx, websocket.MessageText, data))
}

func (c *wsClient) sendIntent(f *wire.IntentFrame) {
	c.t.Helper()
	c.write([]byte(`{"type":"intent","frame":` + string(frameJSON(c.t, f)) + `}`))
}

// respond answers nonce with a signed result.
func (c *wsClient) respond(clock *testclock.Clock, nonce string, success bool, payload string) []byte {
	c.t.Helper()
	res := wire.Result{Success: success, Nonce: nonce}
	if payload != "" {
		res.Payload = json.RawMessage(payload)
	}
	if !success {
		res.Error, res.ErrorCode = "handler failed", "INTENT_HANDLER_ERROR"
	}
	raw, err := res.Build(clock.Now(), c.a.priv)
	require.NoError(c.t, err)
	c.write([]byte(`{"type":"result","frame":` + string(raw) + `}`))
	return raw
}

// intentFrame decodes the frame of a delivered intent message and checks
// it verifies with the senderPublicKey it came with.
func intentFrame(t *testing.T, m wsMsg) *wire.IntentFrame {
	t.Helper()
	require.Equal(t, "intent", m.Type, string(m.raw))
	f, err := wire.DecodeIntentFrame(m.Frame)
	require.NoError(t, err)
	require.Equal(t, "1", f.V)
	pub, err := wire.ParsePublicKey(m.SenderPublicKey)
	require.NoError(t, err)
	require.NoError(t, f.Verify(pub))
	return f
}

func resultOf(t *testing.T, raw []byte) *wire.ResultFrame {
	t.Helper()
	rf, err := wire.DecodeResultFrame(raw)
	require.NoError(t, err, string(raw))
	return rf
}

func errBody(t *testing.T, body []byte) (string, string) {
	t.Helper()
	var v struct {
		Error     string `json:"error"`
		ErrorCode string `json:"errorCode"`
	}
	require.NoError(t, json.Unmarshal(body, &v), string(body))
	return v.ErrorCode, v.Error
}
