package bus

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/testclock"

	"github.com/beamdir/beam/internal/apitest"
)

const testBusKey = "bus-secret-key"

// testOperatorToken is the registry's operator credential in bus tests.
const testOperatorToken = "operator-token"

// testBundle is one directory with its bus under test: a real log in a
// temp dir, a real registry, the relay, the bus and an httptest server.
type testBundle struct {
	t     testing.TB
	path  string
	clock *testclock.Clock
	log   *tracing.Log
	reg   *registry.Registry
	dir   *directory.Directory
	bus   *Bus
	srv   *httptest.Server
	prom  *prometheus.Registry

	closeOnce sync.Once
}

type setupOpts struct {
	path  string
	clock *testclock.Clock
	cfg   func(*Config)
	repl  tracing.Replicator
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
	ctx := context.Background()
	lg, err := tracing.Open(ctx, tracing.Config{Path: o.path, Clock: o.clock.Now, Synchronous: "NORMAL", Replicator: o.repl})
	require.NoError(t, err)
	reg, err := registry.Open(ctx, lg, registry.Config{DefaultPolicy: registry.PolicyAllow, Clock: o.clock.Now,
		OperatorAuth: func(r *http.Request) (string, bool) {
			return "admin", r.Header.Get("Authorization") == "Bearer "+testOperatorToken
		}})
	require.NoError(t, err)
	owners := &testOwners{}
	d, err := directory.New(directory.Config{Log: lg, Registry: reg, Clock: o.clock.Now, Owners: owners})
	require.NoError(t, err)
	prom := prometheus.NewRegistry()
	cfg := Config{Log: lg, Directory: d, Registry: reg, Clock: o.clock.Now, BusAPIKey: testBusKey, Registerer: prom,
		SendWait: 5 * time.Second}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	b, err := New(cfg)
	require.NoError(t, err)
	owners.bus = b
	_, err = b.Recover(ctx)
	require.NoError(t, err)
	mux := http.NewServeMux()
	reg.Routes(mux)
	d.Routes(mux)
	b.Routes(mux)
	srv := httptest.NewServer(mux)
	tb := &testBundle{t: t, path: o.path, clock: o.clock, log: lg, reg: reg, dir: d, bus: b, srv: srv, prom: prom}
	t.Cleanup(tb.close)
	return tb
}

// close stops everything as a process exit would (idempotent).
func (tb *testBundle) close() {
	tb.closeOnce.Do(func() {
		_ = tb.bus.Close()
		tb.srv.CloseClientConnections()
		_ = tb.dir.Close()
		tb.srv.Close()
		_ = tb.reg.Close(context.Background())
		_ = tb.log.Close()
	})
}

// agent is a registered agent with its keys.
type agent struct {
	id     string
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
	apiKey string
}

func (tb *testBundle) register(name string) *agent {
	tb.t.Helper()
	r := apitest.Register(tb.t, tb.srv.URL, name+"@acme.beam.directory", name, nil)
	return &agent{id: r.ID, pub: r.Pub, priv: r.Priv, apiKey: r.APIKey}
}

// call performs a request with an optional API key / bearer and returns the
// status and decoded JSON body.
func (tb *testBundle) call(method, path, apiKey, bearerTok string, body any) (int, map[string]any) {
	tb.t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(tb.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, tb.srv.URL+path, rd)
	require.NoError(tb.t, err)
	if apiKey != "" {
		req.Header.Set("X-Api-Key", apiKey)
	}
	if bearerTok != "" {
		req.Header.Set("Authorization", "Bearer "+bearerTok)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(tb.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(tb.t, err)
	var out map[string]any
	if len(data) > 0 {
		require.NoError(tb.t, json.Unmarshal(data, &out), string(data))
	}
	return resp.StatusCode, out
}

// sendAs posts a message from a with its API key.
func (tb *testBundle) sendAs(a *agent, to, intent string, payload any, extra map[string]any) (int, map[string]any) {
	tb.t.Helper()
	body := map[string]any{"from": a.id, "to": to, "intent": intent, "payload": payload}
	for k, v := range extra {
		body[k] = v
	}
	return tb.call(http.MethodPost, "/v1/beam/send", a.apiKey, "", body)
}

func (tb *testBundle) message(nonce string) tracing.MessageRow {
	tb.t.Helper()
	m, ok, err := tb.log.Message(context.Background(), nonce)
	require.NoError(tb.t, err)
	require.True(tb.t, ok, "no beam_messages row for %s", nonce)
	return m
}

func (tb *testBundle) states(nonce string) []tracing.State {
	tb.t.Helper()
	return apitest.States(tb.t, tb.log, nonce)
}

func (tb *testBundle) waitStatus(nonce string, want tracing.State) tracing.MessageRow {
	tb.t.Helper()
	var m tracing.MessageRow
	require.Eventually(tb.t, func() bool {
		m = tb.message(nonce)
		return m.Status == want
	}, 10*time.Second, 5*time.Millisecond, "message %s never became %s (states %v)", nonce, want, tb.states(nonce))
	return m
}

// tick runs the worker once.
func (tb *testBundle) tick() {
	tb.t.Helper()
	require.NoError(tb.t, tb.bus.Tick(context.Background()))
}

// wsMsg is a message a test agent received.
type wsMsg struct {
	Type            string            `json:"type"`
	Frame           json.RawMessage   `json:"frame"`
	SenderPublicKey string            `json:"senderPublicKey"`
	Attestation     *wire.Attestation `json:"attestation"`
	Bus             *struct {
		MessageID string `json:"messageId"`
		Attempt   int    `json:"attempt"`
		Auth      string `json:"auth"`
		Nonce     string `json:"nonce"`
		Status    string `json:"status"`
	} `json:"bus"`
}

// wsClient is a raw WebSocket session of an agent.
type wsClient struct {
	t    testing.TB
	a    *agent
	conn *websocket.Conn
	msgs chan wsMsg
}

func (tb *testBundle) connect(a *agent) *wsClient {
	tb.t.Helper()
	u := strings.Replace(tb.srv.URL, "http://", "ws://", 1) + "/ws?beamId=" + url.QueryEscape(a.id) + "&apiKey=" + url.QueryEscape(a.apiKey)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, u, nil)
	require.NoError(tb.t, err)
	c := &wsClient{t: tb.t, a: a, conn: conn, msgs: make(chan wsMsg, 256)}
	go func() {
		defer close(c.msgs)
		for {
			_, data, err := conn.Read(context.Background())
			if err != nil {
				return
			}
			var m wsMsg
			if json.Unmarshal(data, &m) == nil {
				c.msgs <- m
			}
		}
	}()
	require.Equal(tb.t, "connected", c.next().Type)
	tb.t.Cleanup(func() { _ = conn.CloseNow() })
	require.Eventually(tb.t, func() bool { return tb.dir.Online(a.id) }, 5*time.Second, time.Millisecond)
	return c
}

func (c *wsClient) next() wsMsg {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		require.True(c.t, ok, "session closed")
		return m
	case <-time.After(10 * time.Second):
		require.FailNow(c.t, "no message within 10s")
		return wsMsg{}
	}
}

// nextIntent returns the next delivered intent and its decoded frame.
func (c *wsClient) nextIntent() (wsMsg, *wire.IntentFrame) {
	c.t.Helper()
	for {
		m := c.next()
		if m.Type != "intent" {
			continue
		}
		f, err := wire.DecodeIntentFrame(m.Frame)
		require.NoError(c.t, err)
		return m, f
	}
}

// respond sends a signed result for nonce.
func (c *wsClient) respond(nonce string, success bool, payload, code string) {
	c.t.Helper()
	res := wire.Result{Success: success, Nonce: nonce}
	if payload != "" {
		res.Payload = json.RawMessage(payload)
	}
	if !success {
		res.ErrorCode, res.Error = code, "handler failed"
	}
	raw, err := res.Build(time.Now(), c.a.priv)
	require.NoError(c.t, err)
	msg, _ := json.Marshal(map[string]any{"type": "result", "frame": json.RawMessage(raw)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(c.t, c.conn.Write(ctx, websocket.MessageText, msg))
}

func nonceOf(t testing.TB, body map[string]any) string {
	t.Helper()
	n, _ := body["nonce"].(string)
	require.NotEmpty(t, n, "no nonce in %v", body)
	return n
}

// sendAsync posts a message from a in the background; the channel is closed
// when the answer arrived.
func (tb *testBundle) sendAsync(a *agent, to, intent string) <-chan struct{} {
	done := make(chan struct{})
	body, _ := json.Marshal(map[string]any{"from": a.id, "to": to, "intent": intent})
	go func() {
		defer close(done)
		req, err := http.NewRequest(http.MethodPost, tb.srv.URL+"/v1/beam/send", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("X-Api-Key", a.apiKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	return done
}

// delay is the bus's wait after the n-th failed attempt of nonce under a
// schedule and jitter (Bus.Delay without a bus).
func delay(schedule []time.Duration, jitter float64, nonce string, n int) time.Duration {
	n = max(n, 1)
	return retryBackoff(schedule, jitter).Delay(n, nonceDraw(nonce, n, jitter))
}

// testOwners is the directory's SessionOwner in tests: the bus, built after
// the directory and filled in before anything is served.
type testOwners struct{ bus *Bus }

func (o *testOwners) Connected(beamID string) { o.bus.AgentConnected(beamID) }

func (o *testOwners) LateResult(beamID string, rf *wire.ResultFrame) bool {
	return o.bus.LateResult(beamID, rf)
}
