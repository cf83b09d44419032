package federation

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/apitest"
)

var durableVolume = flag.Int("federation.volume", 10, "durable intents sent while the peer is down")

// fedDir is one directory under test: real log, registry, relay, NATS and
// HTTP server.
type fedDir struct {
	t        *testing.T
	domain   string
	path     string
	natsAddr string
	key      []byte
	log      *tracing.Log
	reg      *registry.Registry
	dir      *directory.Directory
	node     *Node
	srv      *httptest.Server
	prom     *prometheus.Registry
	owners   *busOwners
	stopped  bool
}

func startDir(t *testing.T, domain, path, natsListen string, mod func(*Config), dmods ...func(*directory.Config)) *fedDir {
	t.Helper()
	d, cfg := prepareDir(t, domain, path, natsListen, mod, dmods...)
	ctx := context.Background()
	node, err := New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, node.Start(ctx))
	mux := http.NewServeMux()
	d.reg.Routes(mux)
	d.dir.Routes(mux)
	node.Routes(mux)
	d.node, d.srv, d.natsAddr = node, httptest.NewServer(mux), node.NATSAddr()
	t.Cleanup(d.stop)
	return d
}

// prepareDir opens the log, registry and relay of a directory under test
// and returns them with the federation config New would get.
func prepareDir(t *testing.T, domain, path, natsListen string, mod func(*Config), dmods ...func(*directory.Config)) (*fedDir, Config) {
	t.Helper()
	if path == "" {
		path = t.TempDir()
	}
	if natsListen == "" {
		natsListen = "127.0.0.1:0"
	}
	ctx := context.Background()
	priv, _, err := LoadOrCreateKey(path)
	require.NoError(t, err)
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(path, "beam.db"), Synchronous: "NORMAL"})
	require.NoError(t, err)
	router := &Router{}
	reg, err := registry.Open(ctx, lg, registry.Config{DefaultPolicy: registry.PolicyAllow, AllowInsecureEndpoints: true,
		Peers: router})
	require.NoError(t, err)
	prom := prometheus.NewRegistry()
	owners := &busOwners{}
	dcfg := directory.Config{Log: lg, Registry: reg, Registerer: prom, HTTPTimeout: 20 * time.Second, WSTimeout: 20 * time.Second,
		Owners: owners, Remote: router}
	for _, m := range dmods {
		m(&dcfg)
	}
	dir, err := directory.New(dcfg)
	require.NoError(t, err)
	cfg := Config{Domain: domain, Key: priv, Log: lg, Directory: dir, Registry: reg, NATSListen: natsListen,
		Registerer: prom, OperatorAuth: func(r *http.Request) bool { return r.Header.Get("X-Admin-Token") == "op" },
		PollInterval: 50 * time.Millisecond, RetryBase: 20 * time.Millisecond, DurableRetryMax: 200 * time.Millisecond,
		SyncRetryMax: 100 * time.Millisecond, BusOutcome: owners.remoteOutcome, Router: router}
	if mod != nil {
		mod(&cfg)
	}
	return &fedDir{t: t, domain: domain, path: path, key: priv, log: lg, reg: reg, dir: dir, prom: prom, owners: owners}, cfg
}

func (d *fedDir) stop() {
	if d.stopped {
		return
	}
	d.stopped = true
	if d.srv != nil {
		d.srv.CloseClientConnections()
		_ = d.node.Close()
	}
	_ = d.dir.Close()
	if d.srv != nil {
		d.srv.Close()
	}
	_ = d.reg.Close(context.Background())
	_ = d.log.Close()
}

// pin makes every directory pin every other one.
func pin(t *testing.T, dirs ...*fedDir) {
	t.Helper()
	for _, a := range dirs {
		for _, b := range dirs {
			if a != b {
				require.NoError(t, a.node.AddPeer(context.Background(), b.node.Self()))
			}
		}
	}
}

// agent registers beamID at d and returns its client (not connected).
func (d *fedDir) agent(name string) *agents.Client {
	d.t.Helper()
	id, err := agents.GenerateIdentity(name + "@" + d.domain)
	require.NoError(d.t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: d.srv.URL, Identity: id, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	require.NoError(d.t, err)
	d.t.Cleanup(func() { _ = c.Close() })
	_, err = c.Register(context.Background(), name, []string{"test"})
	require.NoError(d.t, err)
	return c
}

// registerKey registers name@d with a fresh key the test holds, over HTTP.
func (d *fedDir) registerKey(name string) (ed25519.PublicKey, ed25519.PrivateKey) {
	d.t.Helper()
	a := apitest.Register(d.t, d.srv.URL, name+"@"+d.domain, name, nil)
	return a.Pub, a.Priv
}

func (d *fedDir) trace(nonce string) []tracing.Event {
	d.t.Helper()
	tr, err := d.log.Trace(context.Background(), nonce)
	require.NoError(d.t, err)
	return tr
}

func states(tr []tracing.Event) []tracing.State { return apitest.EventStates(tr) }

func counterValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	require.NoError(t, (<-ch).Write(&m))
	return m.GetCounter().GetValue()
}

func (d *fedDir) rejectedCount(reason string) float64 {
	return counterValue(d.t, d.node.m.rejected.WithLabelValues(reason))
}

func TestThreeDirectoriesWSAndHTTP(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	gamma := startDir(t, "gamma.beam.directory", "", "", nil)
	pin(t, alpha, beta, gamma)

	b := beta.agent("b")
	var handled atomic.Int64
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		handled.Add(1)
		return agents.Success(map[string]any{"echo": string(in.Payload), "from": in.From})
	})
	require.NoError(t, b.Connect(context.Background()))
	c := gamma.agent("c")
	c.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		return agents.Failure("NOPE", "c refuses")
	})
	require.NoError(t, c.Connect(context.Background()))

	// a@alpha over WebSocket.
	aWS := alpha.agent("a")
	require.NoError(t, aWS.Connect(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := aWS.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 1})
	require.NoError(t, err)
	require.True(t, res.Success)
	require.Contains(t, string(res.Payload), "a@alpha.beam.directory")

	// a2@alpha over HTTP (no session).
	aHTTP := alpha.agent("a2")
	res2, err := aHTTP.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 2})
	require.NoError(t, err)
	require.True(t, res2.Success)
	require.EqualValues(t, 2, handled.Load())

	// A recipient's failure crosses as a failure result.
	res3, err := aHTTP.Send(ctx, "c@gamma.beam.directory", "task", map[string]any{})
	require.Error(t, err)
	require.NotNil(t, res3)
	require.Equal(t, "NOPE", res3.ErrorCode)

	// Both traces show the full path, linked by the nonce.
	for _, nonce := range []string{res.Nonce, res2.Nonce} {
		origin := alpha.trace(nonce)
		// The dispatched annotations are the outbox's steps.
		require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched,
			tracing.Delivered, tracing.Acked}, lifecycle(origin))
		require.Equal(t, directory.TransportFederation, origin[2].Transport)
		require.Equal(t, "beta.beam.directory", origin[2].Details.Extra["peer"])
		requireOutboxSteps(t, origin, Published)
		require.Equal(t, "beta.beam.directory", origin[len(origin)-1].Details.Extra["peer"])
		target := beta.trace(nonce)
		require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}, states(target))
		require.Equal(t, directory.OriginFederation, target[0].Transport)
		require.Equal(t, "alpha.beam.directory", target[0].Details.Extra["peer"])
		require.Equal(t, directory.TransportWS, target[2].Transport)
	}
	originFail := alpha.trace(res3.Nonce)
	require.Equal(t, tracing.Failed, originFail[len(originFail)-1].State)
	require.Equal(t, "NOPE", originFail[len(originFail)-1].Details.ErrorCode)
	require.Equal(t, tracing.Failed, gamma.trace(res3.Nonce)[len(gamma.trace(res3.Nonce))-1].State)

	// Outbox rows are all PUBLISHED; the peers saw each other.
	counts, err := alpha.node.Outbox().Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), counts[Published])
	for _, p := range alpha.node.Peers() {
		if p.Domain == "beta.beam.directory" || p.Domain == "gamma.beam.directory" {
			require.False(t, p.LastContact.IsZero(), p.Domain)
		}
	}
	// The key cache served the second intent from a@alpha... a and a2 are different agents; a third intent of a2 hits it.
	_, err = aHTTP.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 3})
	require.NoError(t, err)
	require.GreaterOrEqual(t, counterValue(t, beta.node.m.keyCache.WithLabelValues("hit")), 1.0)

	// Replaying the same frame gives the cached result, not a second delivery.
	before := handled.Load()
	status, body := postJSON(t, alpha.srv.URL+"/intents/send", alpha.trace(res2.Nonce)[0].Details.Frame)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, before, handled.Load())
}

func postJSON(t *testing.T, url string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}

// durableSend records a bus-owned intent and its outbox row through the
// federation API, as the bus does.
func durableSend(t *testing.T, d *fedDir, f *wire.IntentFrame) {
	t.Helper()
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	received := tracing.Event{Nonce: f.Nonce, State: tracing.Received, From: f.From, To: f.To, IntentType: f.Intent, Transport: "bus", Attempt: 1,
		Details: tracing.Details{Owner: tracing.OwnerBus, Frame: raw, Bus: &tracing.BusMessage{MessageID: "msg-" + f.Nonce}}}
	disp := tracing.Event{Nonce: f.Nonce, State: tracing.Dispatched, Transport: directory.TransportFederation, Attempt: 1,
		Details: tracing.Details{Extra: map[string]any{"peer": "beta.beam.directory"}}}
	require.NoError(t, d.node.Forward(context.Background(), directory.ForwardRequest{
		Nonce: f.Nonce, From: f.From, To: f.To, IntentType: f.Intent, Frame: raw, Owner: tracing.OwnerBus, Attempt: 1,
		Timeout: 10 * time.Second,
	}, received, disp))
}

func TestDurableSendsCompleteWhenPeerReturns(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	betaPath := t.TempDir()
	beta := startDir(t, "beta.beam.directory", betaPath, "", nil)
	pin(t, alpha, beta)
	betaNATS := beta.natsAddr

	// a@alpha is registered with a key the test holds.
	_, priv := alpha.registerKey("a")

	var mu sync.Mutex
	deliveries := map[string]int{}
	handler := func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		deliveries[in.Nonce]++
		mu.Unlock()
		return agents.Success(map[string]any{"ok": true})
	}
	bID, err := agents.GenerateIdentity("b@beta.beam.directory")
	require.NoError(t, err)
	b1, err := agents.NewClient(agents.ClientConfig{DirectoryURL: beta.srv.URL, Identity: bID})
	require.NoError(t, err)
	_, err = b1.Register(context.Background(), "b", nil)
	require.NoError(t, err)
	_ = b1.Close()

	// The target directory is down while the intents are sent.
	beta.stop()
	n := *durableVolume
	nonces := make([]string, n)
	for i := range n {
		f := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), time.Now())
		require.NoError(t, wire.SignIntent(f, priv))
		durableSend(t, alpha, f)
		nonces[i] = f.Nonce
	}
	// Attempts fail and are retried while beta is away.
	require.Eventually(t, func() bool {
		return counterValue(t, alpha.node.m.retried.WithLabelValues("beta.beam.directory")) >= float64(n)
	}, 20*time.Second, 20*time.Millisecond)
	for _, nonce := range nonces {
		row, ok, err := alpha.log.Intent(context.Background(), nonce)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, tracing.Dispatched, row.Status)
	}

	// Beta returns on the same NATS address with its data; b reconnects.
	beta2 := startDir(t, "beta.beam.directory", betaPath, betaNATS, nil)
	b2, err := agents.NewClient(agents.ClientConfig{DirectoryURL: beta2.srv.URL, Identity: bID, APIKey: ""})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b2.Close() })
	b2.Handle("task", handler)
	require.NoError(t, b2.Connect(context.Background()))

	require.Eventually(t, func() bool {
		for _, nonce := range nonces {
			row, ok, err := alpha.log.Intent(context.Background(), nonce)
			if err != nil || !ok || row.Status != tracing.Acked {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond)
	mu.Lock()
	require.Len(t, deliveries, n)
	for nonce, k := range deliveries {
		require.Equal(t, 1, k, nonce)
	}
	mu.Unlock()
	counts, err := alpha.node.Outbox().Counts(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(n), counts[Published])
	require.Zero(t, counts[Dead])

	// Operator replay of the PUBLISHED row of an acked intent is refused:
	// the peer's outcome is committed, nothing is left to publish.
	rows, err := alpha.node.Outbox().Rows(context.Background(), Published, 1)
	require.NoError(t, err)
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/federation/outbox/%d/replay", alpha.srv.URL, rows[0].ID), nil)
	req.Header.Set("X-Admin-Token", "op")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode, string(body))
	require.Contains(t, string(body), "INTENT_FINISHED")
	r, _, err := alpha.node.Outbox().Get(context.Background(), rows[0].ID)
	require.NoError(t, err)
	require.Equal(t, Published, r.State)
	mu.Lock()
	require.Equal(t, 1, deliveries[rows[0].Nonce])
	mu.Unlock()
}

func TestSyncSenderTimesOutWhilePeerIsDown(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil, func(c *directory.Config) { c.HTTPTimeout = 2 * time.Second })
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	a := alpha.agent("a")
	beta.agent("b")
	beta.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The sender waits at most the directory's HTTP timeout (2 s); the
	// row dies with that deadline and is not published later.
	done := make(chan error, 1)
	go func() {
		_, err := a.Send(ctx, "b@beta.beam.directory", "task", map[string]any{})
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
		var e *agents.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, directory.CodeTimeout, e.Code)
	case <-ctx.Done():
		t.Fatal("no answer within the sender's deadline")
	}
	require.Eventually(t, func() bool {
		counts, err := alpha.node.Outbox().Counts(context.Background())
		return err == nil && counts[Dead] == 1
	}, 10*time.Second, 20*time.Millisecond)
	rows, err := alpha.node.Outbox().Rows(context.Background(), Dead, 10)
	require.NoError(t, err)
	require.NotEmpty(t, rows[0].LastError)
}

// peerConn connects to d's NATS server as the directory with key priv.
func peerConn(t *testing.T, d *fedDir, priv []byte, domain string) *nats.Conn {
	t.Helper()
	nc, _, _, err := dialAs(d, priv, domain)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func TestSecurityRejections(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	_, aPriv := alpha.registerKey("a")
	b := beta.agent("b")
	var handled atomic.Int64
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		handled.Add(1)
		return agents.Success(nil)
	})
	require.NoError(t, b.Connect(context.Background()))

	nc := peerConn(t, beta, alpha.key, "alpha.beam.directory")
	subj := Subject("beta.beam.directory", "alpha.beam.directory", kindIntent)
	intentMsg := func(f *wire.IntentFrame) *Message {
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		now := time.Now()
		return &Message{Kind: kindIntent, ID: newID(), From: "alpha.beam.directory", To: "beta.beam.directory",
			IssuedAt: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli(), Nonce: f.Nonce, Frame: string(raw),
			Hop: 1, Path: []string{"alpha.beam.directory"}, TimeoutMs: 5000, EventID: f.Nonce + "/1"}
	}
	signed := func(to string) *wire.IntentFrame {
		f := wire.NewIntentFrame("a@alpha.beam.directory", to, "task", json.RawMessage(`{}`), time.Now())
		require.NoError(t, wire.SignIntent(f, aPriv))
		return f
	}
	reply := func(tok []byte) *Message { return requestReply(t, nc, subj, tok, alpha) }

	// A valid message is accepted (control).
	good := intentMsg(signed("b@beta.beam.directory"))
	tok, err := seal(good, alpha.key)
	require.NoError(t, err)
	m := reply(tok)
	require.Equal(t, statusResult, m.Status, m.Error)
	require.EqualValues(t, 1, handled.Load())

	// 1. Replayed federation message: dropped, counted.
	_, err = nc.Request(subj, tok, 500*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectReplay) == 1 }, 5*time.Second, 10*time.Millisecond)

	// 2. Signed by an unpinned key (claiming to be alpha): dropped, counted.
	_, rogue, err := wire.GenerateKey()
	require.NoError(t, err)
	tok, err = seal(intentMsg(signed("b@beta.beam.directory")), rogue)
	require.NoError(t, err)
	_, err = nc.Request(subj, tok, 500*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectBadSignature) == 1 }, 5*time.Second, 10*time.Millisecond)
	// ... and a kid nobody pinned.
	um := intentMsg(signed("b@beta.beam.directory"))
	um.From = "rogue.beam.directory"
	tok, err = seal(um, rogue)
	require.NoError(t, err)
	_, err = nc.Request(subj, tok, 500*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectUnpinned) >= 1 }, 5*time.Second, 10*time.Millisecond)

	// 3. Forged sender signature: refused with INVALID_INTENT, counted, never delivered.
	forged := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
	require.NoError(t, wire.SignIntent(forged, rogue))
	tok, err = seal(intentMsg(forged), alpha.key)
	require.NoError(t, err)
	m = reply(tok)
	require.Equal(t, statusError, m.Status)
	require.Equal(t, directory.CodeInvalidIntent, m.ErrorCode)
	require.Equal(t, 1.0, beta.rejectedCount(rejectSender))
	_, ok, err := beta.log.Intent(context.Background(), forged.Nonce)
	require.NoError(t, err)
	require.False(t, ok, "a forged frame must not burn the nonce")

	// 4. A peer forwarding another domain's agent: refused.
	other := wire.NewIntentFrame("x@gamma.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
	require.NoError(t, wire.SignIntent(other, rogue))
	tok, err = seal(intentMsg(other), alpha.key)
	require.NoError(t, err)
	m = reply(tok)
	require.Equal(t, directory.CodeForbidden, m.ErrorCode)

	// 5. Hop limit and loops.
	hm := intentMsg(signed("b@beta.beam.directory"))
	hm.Hop = maxHops + 1
	tok, err = seal(hm, alpha.key)
	require.NoError(t, err)
	require.Equal(t, codeHopLimit, reply(tok).ErrorCode)
	lm := intentMsg(signed("b@beta.beam.directory"))
	lm.Path = []string{"alpha.beam.directory", "beta.beam.directory"}
	tok, err = seal(lm, alpha.key)
	require.NoError(t, err)
	require.Equal(t, codeLoop, reply(tok).ErrorCode)

	// 6. Publishing outside its subjects: the server refuses and counts it.
	errs := make(chan error, 4)
	nc2 := func() *nats.Conn {
		kp, err := nkeyPair(alpha.key)
		require.NoError(t, err)
		pub, _ := kp.PublicKey()
		c, err := nats.Connect("nats://"+beta.natsAddr, nats.Secure(PeerTLS(ed25519.PrivateKey(beta.key).Public().(ed25519.PublicKey))), nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(InboxPrefix("alpha.beam.directory")),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}()
	require.NoError(t, nc2.Publish(Subject("beta.beam.directory", "gamma.beam.directory", kindIntent), []byte("x")))
	require.NoError(t, nc2.Flush())
	select {
	case err := <-errs:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
	case <-time.After(5 * time.Second):
		t.Fatal("no permission violation reported")
	}
	_, err = nc2.SubscribeSync(subjectPrefix + ".beta_beam_directory.>")
	require.NoError(t, err)
	require.NoError(t, nc2.Flush())
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectPermission) >= 2 }, 5*time.Second, 10*time.Millisecond)

	// 7. An unpinned directory cannot connect at all.
	_, strangerKey, err := wire.GenerateKey()
	require.NoError(t, err)
	kp, err := nkeyPair(strangerKey)
	require.NoError(t, err)
	pub, _ := kp.PublicKey()
	betaTLS := nats.Secure(PeerTLS(ed25519.PrivateKey(beta.key).Public().(ed25519.PublicKey)))
	_, err = nats.Connect("nats://"+beta.natsAddr, betaTLS, nats.Nkey(pub, kp.Sign))
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// Only the control intent reached the agent.
	require.EqualValues(t, 1, handled.Load())

	// Removing a peer refuses it from then on.
	ok, err = beta.node.RemovePeer(context.Background(), "alpha.beam.directory")
	require.NoError(t, err)
	require.True(t, ok)
	kpA, err := nkeyPair(alpha.key)
	require.NoError(t, err)
	pubA, _ := kpA.PublicKey()
	_, err = nats.Connect("nats://"+beta.natsAddr, betaTLS, nats.Nkey(pubA, kpA.Sign))
	require.ErrorIs(t, err, nats.ErrAuthorization)
}

func TestOperatorAPI(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	do := func(method, path string, body any, token string) (int, map[string]any) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, alpha.srv.URL+path, rd)
		if token != "" {
			req.Header.Set("X-Admin-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	st, _ := do("GET", "/federation/peers", nil, "")
	require.Equal(t, http.StatusUnauthorized, st)
	st, out := do("GET", "/federation/self", nil, "op")
	require.Equal(t, http.StatusOK, st)
	require.Equal(t, alpha.node.Self().Line(), out["line"])
	st, out = do("POST", "/federation/peers", map[string]string{"line": "nonsense"}, "op")
	require.Equal(t, http.StatusBadRequest, st)
	require.Equal(t, "INVALID_PEER", out["errorCode"])
	st, _ = do("POST", "/federation/peers", map[string]string{"line": beta.node.Self().Line()}, "op")
	require.Equal(t, http.StatusCreated, st)
	st, out = do("GET", "/federation/peers", nil, "op")
	require.Equal(t, http.StatusOK, st)
	require.Len(t, out["peers"], 1)
	st, out = do("GET", "/federation/outbox", nil, "op")
	require.Equal(t, http.StatusOK, st)
	require.Contains(t, out, "counts")
	st, _ = do("POST", "/federation/outbox/12345/replay", nil, "op")
	require.Equal(t, http.StatusNotFound, st)
	st, _ = do("DELETE", "/federation/peers/beta.beam.directory", nil, "op")
	require.Equal(t, http.StatusOK, st)
	st, _ = do("DELETE", "/federation/peers/beta.beam.directory", nil, "op")
	require.Equal(t, http.StatusNotFound, st)
	// Peers survive a restart of the node (stored in the log's file).
	st, _ = do("POST", "/federation/peers", map[string]string{"line": beta.node.Self().Line()}, "op")
	require.Equal(t, http.StatusCreated, st)
	peers, err := peerStore{log: alpha.log}.load(context.Background())
	require.NoError(t, err)
	require.Len(t, peers, 1)
	require.Equal(t, "beta.beam.directory", peers[0].Domain)
}

// A relay that crashes after the peer committed but before PUBLISHED:
// the next process releases the claim, publishes again, the receiver
// answers from its log, and the agent is called once.
func TestRelayCrashAfterPublishBeforeFinalize(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	_, priv := alpha.registerKey("a")
	b := beta.agent("b")
	var handled atomic.Int64
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		handled.Add(1)
		return agents.Success(map[string]any{"ok": true})
	})
	require.NoError(t, b.Connect(context.Background()))

	// beta knows a's key already (resolved while alpha's NATS was up).
	_, err := beta.node.resolveKey(context.Background(), alpha.domain, "a@alpha.beam.directory")
	require.NoError(t, err)
	// The relay of this process is gone; the row is written anyway.
	require.NoError(t, alpha.node.Close())
	f := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
	require.NoError(t, wire.SignIntent(f, priv))
	durableSend(t, alpha, f)

	// A relay claims it and publishes; the peer commits; the relay dies
	// before finalizing (no PUBLISHED).
	ob := alpha.node.Outbox()
	cs, err := ob.Claim(context.Background(), "crashed-relay", 1)
	require.NoError(t, err)
	require.Len(t, cs, 1)
	c := cs[0]
	var fp forwardPayload
	require.NoError(t, json.Unmarshal(c.Payload, &fp))
	now := time.Now()
	msg := &Message{Kind: kindIntent, ID: newID(), From: alpha.domain, To: beta.domain, IssuedAt: now.UnixMilli(),
		Expires: now.Add(time.Minute).UnixMilli(), EventID: c.EventID, Nonce: c.Nonce, Frame: fp.Frame, Hop: 1,
		Path: []string{alpha.domain}, TimeoutMs: fp.TimeoutMs, Owner: c.Owner}
	tok, err := seal(msg, alpha.key)
	require.NoError(t, err)
	nc := peerConn(t, beta, alpha.key, alpha.domain)
	rep, err := nc.Request(Subject(beta.domain, alpha.domain, kindIntent), tok, 20*time.Second)
	require.NoError(t, err)
	m, err := open(rep.Data, alpha.domain, beta.domain, kindResult, alpha.node.pinnedKey, time.Now())
	require.NoError(t, err)
	require.Equal(t, statusResult, m.Status)
	require.EqualValues(t, 1, handled.Load())
	r, _, err := ob.Get(context.Background(), c.ID)
	require.NoError(t, err)
	require.Equal(t, Claimed, r.State)

	// The next process starts on the same file and NATS address.
	node2, err := New(context.Background(), Config{Domain: alpha.domain, Key: alpha.key, Log: alpha.log, Directory: alpha.dir,
		Registry: alpha.reg, NATSListen: alpha.natsAddr, PollInterval: 50 * time.Millisecond, RetryBase: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node2.Close() })
	require.NoError(t, node2.Start(context.Background()))

	require.Eventually(t, func() bool {
		row, ok, err := alpha.log.Intent(context.Background(), f.Nonce)
		return err == nil && ok && row.Status == tracing.Acked
	}, 20*time.Second, 20*time.Millisecond)
	r, _, err = ob.Get(context.Background(), c.ID)
	require.NoError(t, err)
	require.Equal(t, Published, r.State)
	require.Equal(t, 2, r.Attempts, "the released claim counts as an attempt, and so does the publish")
	require.EqualValues(t, 1, handled.Load(), "delivered to the agent exactly once")
	acks := 0
	for _, ev := range alpha.trace(f.Nonce) {
		if ev.State == tracing.Acked {
			acks++
		}
	}
	require.Equal(t, 1, acks)
	// The target's trace shows one delivery too.
	delivered := 0
	for _, ev := range beta.trace(f.Nonce) {
		if ev.State == tracing.Delivered {
			delivered++
		}
	}
	require.Equal(t, 1, delivered)
}
