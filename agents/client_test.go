package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
)

// testBundle is a real in-process directory on a loopback listener.
type testBundle struct {
	url string
	// restart stops the directory and starts it again on the same address
	// and data directory.
	restart func(t *testing.T)
}

// testLogger logs warnings and errors to the test's output (shown with -v
// and when the test fails), and nothing once the test's cleanups began.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(beamtest.LogWriter(t, ""), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startDirectory starts a directory in t.TempDir() and fails the test when
// the assembly does not mount the agent routes.
func startDirectory(t *testing.T, cfg beam.Config) *testBundle {
	t.Helper()
	cfg.DataDir = t.TempDir()
	// The SDK tests put several agents in one org; org approval is tested
	// in directory/registry.
	cfg.OpenOrgs = true
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	cfg.Limits = &beam.Limits{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &dirProc{cfg: cfg, addr: ln.Addr().String()}
	d.start(t, ln)
	t.Cleanup(func() { require.NoError(t, d.stop()) })
	url := "http://" + d.addr
	resp, err := http.Post(url+"/agents/register", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEqual(t, http.StatusNotFound, resp.StatusCode, "the server must mount the directory's registration route")
	return &testBundle{url: url, restart: d.restart}
}

// dirProc runs a beam.Server behind an http.Server of the test's own.
type dirProc struct {
	cfg  beam.Config
	addr string
	srv  *beam.Server
	hs   *http.Server
	done chan error
}

func (d *dirProc) start(t *testing.T, ln net.Listener) {
	t.Helper()
	srv, err := beam.New(context.Background(), d.cfg)
	require.NoError(t, err)
	d.srv = srv
	d.hs = &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	d.done = make(chan error, 1)
	go func(hs *http.Server, done chan<- error) { done <- hs.Serve(ln) }(d.hs, d.done)
}

func (d *dirProc) stop() error {
	if d.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := errors.Join(d.hs.Shutdown(ctx), d.srv.Shutdown(ctx))
	if serr := <-d.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	d.srv, d.hs = nil, nil
	return err
}

func (d *dirProc) restart(t *testing.T) {
	t.Helper()
	require.NoError(t, d.stop())
	ln, err := net.Listen("tcp", d.addr)
	require.NoError(t, err)
	d.start(t, ln)
}

func setup(t *testing.T) *testBundle { return startDirectory(t, beam.Config{}) }

// agentOpt adjusts a client configuration.
type agentOpt func(*agents.ClientConfig)

// newClient builds a client for id, closed at the end of the test.
func (b *testBundle) newClient(t *testing.T, id *agents.Identity, opts ...agentOpt) *agents.Client {
	t.Helper()
	cfg := agents.ClientConfig{
		DirectoryURL: b.url,
		Identity:     id,
		Logger:       testLogger(t),
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 200 * time.Millisecond,
		SendTimeout:  20 * time.Second,
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := agents.NewClient(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// agent generates and registers beamID and returns its client.
func (b *testBundle) agent(t *testing.T, beamID string, opts ...agentOpt) (*agents.Client, *agents.Identity) {
	t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	c := b.newClient(t, id, opts...)
	res, err := c.Register(context.Background(), "Agent "+beamID, []string{"test"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(res.APIKey, "bk_"), "api key %q", res.APIKey)
	return c, id
}

// connected generates, registers and connects beamID.
func (b *testBundle) connected(t *testing.T, beamID string, opts ...agentOpt) (*agents.Client, *agents.Identity) {
	t.Helper()
	c, id := b.agent(t, beamID, opts...)
	require.NoError(t, c.Connect(context.Background()))
	require.True(t, c.Connected())
	return c, id
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRegisterLookupSearch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)

	id, err := agents.GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	c := b.newClient(t, id)
	res, err := c.Register(ctx, "Alice", []string{"quote.request", "inventory.check"})
	require.NoError(t, err)
	require.True(t, res.Created)
	require.True(t, strings.HasPrefix(res.APIKey, "bk_"))
	require.Equal(t, "alice@acme.beam.directory", res.Agent.BeamID)
	require.Equal(t, "acme", res.Agent.Org)
	require.Equal(t, id.PublicKeyBase64(), res.Agent.PublicKey)
	require.Equal(t, res.APIKey, c.APIKey(), "the client adopts the minted key")

	// The same key again, from a client without the API key: idempotent, no new key.
	again := b.newClient(t, id)
	res2, err := again.Register(ctx, "Alice", []string{"quote.request", "inventory.check"})
	require.NoError(t, err)
	require.False(t, res2.Created)
	require.Empty(t, res2.APIKey)

	// Someone else's key for the same Beam ID is refused.
	thief, err := agents.GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	_, err = b.newClient(t, thief).Register(ctx, "Mallory", nil)
	require.Error(t, err)
	require.Equal(t, "BEAM_ID_TAKEN", agents.ErrorCode(err))

	a, err := c.Lookup(ctx, "alice@acme.beam.directory")
	require.NoError(t, err)
	require.Equal(t, "Alice", a.DisplayName)
	require.ElementsMatch(t, []string{"quote.request", "inventory.check"}, a.Capabilities)
	require.Equal(t, "did:beam:acme:alice", a.DID)

	_, err = c.Lookup(ctx, "nobody@acme.beam.directory")
	var e *agents.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusNotFound, e.Status)

	_, _ = b.agent(t, "bob@acme.beam.directory")
	_, _ = b.agent(t, "carol@globex.beam.directory")
	sr, err := c.Search(ctx, agents.SearchQuery{Org: "acme"})
	require.NoError(t, err)
	var ids []string
	for _, a := range sr.Agents {
		ids = append(ids, a.BeamID)
	}
	require.ElementsMatch(t, []string{"alice@acme.beam.directory", "bob@acme.beam.directory"}, ids)
	require.Equal(t, 2, sr.Total)

	sr, err = c.Search(ctx, agents.SearchQuery{Capabilities: []string{"inventory.check"}})
	require.NoError(t, err)
	require.Len(t, sr.Agents, 1)
	require.Equal(t, "alice@acme.beam.directory", sr.Agents[0].BeamID)
}

func TestSendOverWebSocketToHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory")
	bob, bobID := b.connected(t, "bob@acme.beam.directory")

	got := make(chan *agents.Intent, 1)
	bob.Handle("agent.ping", func(_ context.Context, in *agents.Intent) agents.Reply {
		got <- in
		var p struct {
			N int `json:"n"`
		}
		if err := in.Bind(&p); err != nil {
			return agents.Failure("BAD_PAYLOAD", err.Error())
		}
		return agents.Success(map[string]any{"pong": p.N + 1, "from": in.From})
	})

	res, err := alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", map[string]any{"n": 41, "note": "<&> ü"})
	require.NoError(t, err)
	require.True(t, res.Success)
	require.JSONEq(t, `{"pong":42,"from":"alice@acme.beam.directory"}`, string(res.Payload))
	require.NoError(t, res.Verify(bobID.Public), "results are signed by the recipient")
	require.NotNil(t, res.Latency)

	in := <-got
	require.Equal(t, "alice@acme.beam.directory", in.From)
	require.Equal(t, "bob@acme.beam.directory", in.To)
	require.Equal(t, "agent.ping", in.Type)
	require.Equal(t, res.Nonce, in.Nonce)
	require.JSONEq(t, `{"n":41,"note":"<&> ü"}`, string(in.Payload))

	// The wildcard handler takes intents without their own handler.
	bob.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]string{"wildcard": in.Type})
	})
	res, err = alice.Send(ctx, "bob@acme.beam.directory", "agent.introduce", nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"wildcard":"agent.introduce"}`, string(res.Payload))
}

func TestSendOverHTTPWhenNotConnected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.agent(t, "alice@acme.beam.directory") // never connects
	bob, _ := b.connected(t, "bob@acme.beam.directory")
	var calls atomic.Int32
	bob.Handle("agent.ping", func(context.Context, *agents.Intent) agents.Reply {
		calls.Add(1)
		return agents.Success(map[string]bool{"pong": true})
	})
	require.False(t, alice.Connected())
	res, err := alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", json.RawMessage(`{"via":"http"}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"pong":true}`, string(res.Payload))
	require.EqualValues(t, 1, calls.Load())

	// A recipient with no session fails fast with OFFLINE (HTTP 503).
	_, _ = b.agent(t, "carol@acme.beam.directory")
	_, err = alice.Send(ctx, "carol@acme.beam.directory", "agent.ping", nil)
	var e *agents.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, "OFFLINE", e.Code)
	require.Equal(t, http.StatusServiceUnavailable, e.Status)
}

func TestTalkToEcho(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.agent(t, "alice@acme.beam.directory")

	reply, err := alice.Talk(ctx, "echo@beam.directory", "hello over http")
	require.NoError(t, err)
	require.Equal(t, "Echo: hello over http", reply)

	require.NoError(t, alice.Connect(ctx))
	reply, err = alice.Talk(ctx, "echo@beam.directory", "hello over ws")
	require.NoError(t, err)
	require.Equal(t, "Echo: hello over ws", reply)
}

func TestHandlerAcceptIsAsync(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory")
	bob, _ := b.connected(t, "bob@acme.beam.directory")
	bob.Handle("task.delegate", func(context.Context, *agents.Intent) agents.Reply { return agents.Accept() })

	res, err := alice.Send(ctx, "bob@acme.beam.directory", "task.delegate", map[string]string{"task": "audit"})
	require.NoError(t, err)
	require.True(t, res.Success)
	require.True(t, wire.IsAsyncAcceptance(res))
	require.JSONEq(t, `{"accepted":true,"acknowledgement":"accepted","terminal":false}`, string(res.Payload))
}

func TestFailuresSurfaceAsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory")
	bob, _ := b.connected(t, "bob@acme.beam.directory")
	bob.Handle("quote.request", func(context.Context, *agents.Intent) agents.Reply {
		return agents.Failure("QUOTE_UNAVAILABLE", "no stock")
	})
	bob.Handle("agent.ping", func(context.Context, *agents.Intent) agents.Reply { panic("boom") })

	res, err := alice.Send(ctx, "bob@acme.beam.directory", "quote.request", map[string]int{"quantity": 3})
	var e *agents.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, "QUOTE_UNAVAILABLE", e.Code)
	require.Equal(t, "no stock", e.Message)
	require.NotNil(t, res, "a failure result is returned with the error")
	require.False(t, res.Success)

	_, err = alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", nil)
	require.Equal(t, "INTENT_HANDLER_ERROR", agents.ErrorCode(err))

	// No handler at all: answered, not dropped.
	_, err = alice.Send(ctx, "bob@acme.beam.directory", "agent.introduce", nil)
	require.Equal(t, "UNSUPPORTED_INTENT", agents.ErrorCode(err))

	// The directory's own refusals arrive as error frames on the socket:
	// an agent of another org is denied by the default policy.
	_, _ = b.connected(t, "carol@globex.beam.directory")
	_, err = alice.Send(ctx, "carol@globex.beam.directory", "agent.ping", nil)
	require.Error(t, err)
	require.Equal(t, "FORBIDDEN", agents.ErrorCode(err))

	// The same over HTTP is a 403.
	http1, _ := b.agent(t, "dave@acme.beam.directory")
	_, err = http1.Send(ctx, "carol@globex.beam.directory", "agent.ping", nil)
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusForbidden, e.Status)
}

func TestConnectWithSignatureProof(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	_, id := b.agent(t, "alice@acme.beam.directory")
	// A client without the API key proves the session with a signature.
	c := b.newClient(t, id)
	require.Empty(t, c.APIKey())
	require.NoError(t, c.Connect(ctx))
	reply, err := c.Talk(ctx, "echo@beam.directory", "signed")
	require.NoError(t, err)
	require.Equal(t, "Echo: signed", reply)

	// A client holding a key the directory does not know for the Beam ID is refused.
	other, err := agents.GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	bad := b.newClient(t, other)
	err = bad.Connect(ctx)
	require.Equal(t, "CONNECT_REFUSED", agents.ErrorCode(err), "%v", err)
	require.False(t, bad.Connected())

	unregistered, err := agents.GenerateIdentity("ghost@acme.beam.directory")
	require.NoError(t, err)
	err = b.newClient(t, unregistered).Connect(ctx)
	require.Equal(t, "CONNECT_REFUSED", agents.ErrorCode(err), "%v", err)
}

func TestReconnectAfterSessionReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory")
	bob, _ := b.connected(t, "bob@acme.beam.directory")
	alice.Handle("agent.ping", func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]string{"pong": in.Nonce})
	})
	_, err := bob.Send(ctx, "alice@acme.beam.directory", "agent.ping", nil)
	require.NoError(t, err)

	// A second session for alice replaces the client's (close 1001). The
	// client reconnects, which in turn replaces the intruding session: that
	// session's close proves the reconnection.
	h := http.Header{}
	h.Set("x-api-key", alice.APIKey())
	wsURL := "ws" + strings.TrimPrefix(b.url, "http") + "/ws?beamId=alice%40acme.beam.directory"
	intruder, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h})
	require.NoError(t, err)
	defer intruder.CloseNow()
	_, first, err := intruder.Read(ctx)
	require.NoError(t, err)
	require.Contains(t, string(first), `"connected"`)
	for {
		_, _, err = intruder.Read(ctx)
		if err != nil {
			break
		}
	}
	require.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "the intruder is replaced: %v", err)
	require.Eventually(t, alice.Connected, 10*time.Second, 10*time.Millisecond)

	// Handlers survived and both directions work over the new session.
	res, err := bob.Send(ctx, "alice@acme.beam.directory", "agent.ping", nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"pong":"`+res.Nonce+`"}`, string(res.Payload))
	reply, err := alice.Talk(ctx, "echo@beam.directory", "back")
	require.NoError(t, err)
	require.Equal(t, "Echo: back", reply)
}

func TestReconnectAfterDirectoryRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	fastPing := func(c *agents.ClientConfig) { c.PingInterval = 100 * time.Millisecond }
	alice, _ := b.connected(t, "alice@acme.beam.directory", fastPing)
	bob, _ := b.connected(t, "bob@acme.beam.directory", fastPing)
	bob.Handle("agent.ping", func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]string{"pong": in.Nonce})
	})

	b.restart(t)

	// Both clients notice, reconnect (to the same data directory, so with the
	// same registrations) and bob's handler answers again.
	require.Eventually(t, func() bool {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := alice.Send(sctx, "bob@acme.beam.directory", "agent.ping", nil)
		return err == nil
	}, 20*time.Second, 50*time.Millisecond)
	require.Eventually(t, alice.Connected, 10*time.Second, 10*time.Millisecond)
	reply, err := alice.Talk(ctx, "echo@beam.directory", "after restart")
	require.NoError(t, err)
	require.Equal(t, "Echo: after restart", reply)
}

func TestCloseFailsPendingAndLaterCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory")
	bob, _ := b.connected(t, "bob@acme.beam.directory")
	entered := make(chan struct{})
	release := make(chan struct{})
	bob.Handle("agent.ping", func(ctx context.Context, _ *agents.Intent) agents.Reply {
		close(entered)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return agents.Success(nil)
	})
	errc := make(chan error, 1)
	go func() {
		_, err := alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", nil)
		errc <- err
	}()
	<-entered
	require.NoError(t, alice.Close())
	require.ErrorIs(t, <-errc, agents.ErrClosed)
	close(release)
	_, err := alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", nil)
	require.ErrorIs(t, err, agents.ErrClosed)
	require.ErrorIs(t, alice.Connect(ctx), agents.ErrClosed)
}

func TestNewClientChecksConfig(t *testing.T) {
	t.Parallel()
	id, err := agents.GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	_, err = agents.NewClient(agents.ClientConfig{DirectoryURL: "http://127.0.0.1:1", Identity: id, Protocol: agents.ProtocolBeam2})
	require.NoError(t, err)
	_, err = agents.NewClient(agents.ClientConfig{DirectoryURL: "http://127.0.0.1:1", Identity: id, Protocol: "beam/3"})
	require.ErrorIs(t, err, agents.ErrProtocolUnsupported)
	_, err = agents.NewClient(agents.ClientConfig{DirectoryURL: "ftp://x", Identity: id})
	require.Error(t, err)
	_, err = agents.NewClient(agents.ClientConfig{DirectoryURL: "http://x"})
	require.Error(t, err)
}

func TestIdentitySaveLoad(t *testing.T) {
	t.Parallel()
	id, err := agents.GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	path := t.TempDir() + "/alice.json"
	require.NoError(t, id.Save(path))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var m map[string]string
	require.NoError(t, json.Unmarshal(raw, &m))
	require.Equal(t, "alice@acme.beam.directory", m["beamId"])
	require.True(t, strings.HasPrefix(m["publicKeyBase64"], "MCowBQYDK2VwAyEA"))
	require.True(t, strings.HasPrefix(m["privateKeyBase64"], "MC4CAQAwBQYDK2VwBCIEI"))
	require.NotContains(t, m, "apiKey")

	got, err := agents.LoadIdentity(path)
	require.NoError(t, err)
	require.Equal(t, id.BeamID, got.BeamID)
	require.True(t, bytes.Equal(id.Private, got.Private))
	require.True(t, bytes.Equal(id.Public, got.Public))

	got.APIKey = "bk_test"
	require.NoError(t, got.Save(path))
	again, err := agents.LoadIdentity(path)
	require.NoError(t, err)
	require.Equal(t, "bk_test", again.APIKey)

	// Mismatched halves, bad Beam IDs and garbage are refused.
	other, err := agents.GenerateIdentity("bob@acme.beam.directory")
	require.NoError(t, err)
	bad := fmtJSON(m["beamId"], wire.EncodePublicKey(other.Public), m["privateKeyBase64"])
	require.Error(t, json.Unmarshal(bad, new(agents.Identity)))
	require.Error(t, json.Unmarshal(fmtJSON("Alice@nowhere", m["publicKeyBase64"], m["privateKeyBase64"]), new(agents.Identity)))
	_, err = agents.GenerateIdentity("not a beam id")
	require.Error(t, err)
	_, err = agents.LoadIdentity(t.TempDir() + "/missing.json")
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func fmtJSON(beamID, pub, priv string) []byte {
	b, _ := json.Marshal(map[string]string{"beamId": beamID, "publicKeyBase64": pub, "privateKeyBase64": priv})
	return b
}
