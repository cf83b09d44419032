package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

func showSelf(t *testing.T, dataDir, domain, natsAddr string) string {
	t.Helper()
	out, err := beamtest.Run(t, context.Background(), "peer", "show-self", "--data-dir", dataDir, "--domain", domain, "--nats-listen", natsAddr)
	require.NoError(t, err, out)
	line := strings.TrimSpace(out)
	require.True(t, strings.HasPrefix(line, domain+"=nats://"+natsAddr+"#"), line)
	require.NotContains(t, line, "\n")
	// Stable: a second call prints the same line.
	again, err := beamtest.Run(t, context.Background(), "peer", "show-self", "--data-dir", dataDir, "--domain", domain, "--nats-listen", natsAddr)
	require.NoError(t, err)
	require.Equal(t, line, strings.TrimSpace(again))
	return line
}

func TestPeerShowSelf(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	showSelf(t, dir, "acme.beam.directory", "127.0.0.1:4222")
	out, err := beamtest.Run(t, context.Background(), "peer", "show-self", "--data-dir", dir, "--domain", "not a domain", "--nats-listen", "127.0.0.1:4222")
	require.Error(t, err, out)
}

// Two beam serve processes: the target directory is stopped, 100 intents
// are sent, the target comes back, and every intent is acked at the origin
// and delivered once to the agent. The target pins the origin only once
// its agent is connected again (beam peer add at run time): until then the
// origin's relay cannot reach it, so no retry finds the agent offline.
func TestFederationProcessesPeerDown(t *testing.T) {
	t.Parallel()
	common := []string{"--default-policy", "allow", "--http-timeout", "120s"}
	fp := startFedPair(t, false, common, common)
	alpha, beta := fp.alpha, fp.beta

	pub, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	reg, _ := json.Marshal(map[string]any{"beamId": "a@alpha.beam.directory", "displayName": "a", "publicKey": wire.EncodePublicKey(pub), "capabilities": []string{}})
	resp, err := http.Post(alpha.URL()+"/agents/register", "application/json", bytes.NewReader(reg))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	bID, err := agents.GenerateIdentity("b@beta.beam.directory")
	require.NoError(t, err)
	var mu sync.Mutex
	deliveries := map[string]int{}
	connectB := func(url string) *agents.Client {
		c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: bID})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		c.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
			mu.Lock()
			deliveries[in.Nonce]++
			mu.Unlock()
			return agents.Success(map[string]any{"ok": true})
		})
		_, err = c.Register(context.Background(), "b", nil)
		require.NoError(t, err)
		require.NoError(t, c.Connect(context.Background()))
		return c
	}
	b1 := connectB(beta.URL())
	bID.APIKey = b1.APIKey()

	_ = b1.Close()
	beta.Stop()
	const n = 100
	nonces := make([]string, n)
	results := make(chan int, n)
	for i := range n {
		f := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
		require.NoError(t, wire.SignIntent(f, priv))
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		nonces[i] = f.Nonce
		go func() {
			resp, err := http.Post(alpha.URL()+"/intents/send", "application/json", bytes.NewReader(raw))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	beta.Restart()
	connectB(beta.URL())
	out, err := beamtest.Run(t, context.Background(), "peer", "add", "--url", beta.URL(), "--data-dir", beta.DataDir, fp.alphaLine)
	require.NoError(t, err, out)
	for range n {
		select {
		case st := <-results:
			require.Equal(t, http.StatusOK, st)
		case <-time.After(150 * time.Second):
			t.Fatal("intents did not complete after the target returned")
		}
	}
	mu.Lock()
	require.Len(t, deliveries, n)
	for nonce, k := range deliveries {
		require.Equal(t, 1, k, nonce)
	}
	mu.Unlock()
}

// The show-self command itself, without the binary's command table.
func TestPeerShowSelfInProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	require.NoError(t, runPeer(context.Background(), []string{"show-self", "--data-dir", dir, "--domain", "acme.beam.directory", "--nats-listen", "127.0.0.1:4222"}, &out, &errOut))
	line := strings.TrimSpace(out.String())
	require.Regexp(t, `^acme\.beam\.directory=nats://127\.0\.0\.1:4222#[A-Za-z0-9_-]{43}$`, line)
	out.Reset()
	require.NoError(t, runPeer(context.Background(), []string{"show-self", "--data-dir", dir, "--domain", "acme.beam.directory", "--nats-listen", "127.0.0.1:4222"}, &out, &errOut))
	require.Equal(t, line, strings.TrimSpace(out.String()))
	require.ErrorIs(t, runPeer(context.Background(), []string{"show-self", "--data-dir", dir}, &out, &errOut), errUsage)
	require.Error(t, runPeer(context.Background(), []string{"add", "--admin-token", "x", "garbage"}, &out, &errOut))
}

// The federation node is the bus's router to peer directories.
var _ bus.Remote = (*federation.Node)(nil)

var fedDurableCount = flag.Int("fed-durable-count", 100, "durable intents per phase of TestFederationDurableProcesses")

// deliveryCounter is a beta agent's handler counting deliveries per nonce;
// while hold is set the handler reports on held and waits.
type deliveryCounter struct {
	mu   sync.Mutex
	seen map[string]int
	// attested says, per nonce, who attested a frame the sender did not
	// sign (nil map: not recorded).
	attested map[string]string
	hold     chan struct{}
	held     chan struct{} // buffered 1
}

func (d *deliveryCounter) handle(ctx context.Context, in *agents.Intent) agents.Reply {
	d.mu.Lock()
	d.seen[in.Nonce]++
	if d.attested != nil && in.Attested != nil {
		d.attested[in.Nonce] = in.Attested.Auth + " by " + in.Attested.By + ", vouched by " + in.Attested.VouchedBy
	}
	hold := d.hold
	d.mu.Unlock()
	if hold != nil {
		select {
		case d.held <- struct{}{}:
		default:
		}
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	return agents.Success(map[string]any{"nonce": in.Nonce})
}

func (d *deliveryCounter) requireOnce(t *testing.T, nonces []string) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, nonce := range nonces {
		require.Equal(t, 1, d.seen[nonce], "deliveries of %s to the agent", nonce)
	}
}

// messageStates counts the bus messages of nonces by status in a running
// (or stopped) directory's log; "error" counts what could not be read.
func messageStates(dataDir string, nonces []string) map[tracing.State]int {
	out := map[tracing.State]int{}
	for _, nonce := range nonces {
		steps, err := readEvents(dataDir, nonce)
		switch {
		case err != nil:
			out["error"]++
		case len(steps) == 0:
			out["missing"]++
		default:
			out[steps[len(steps)-1].State]++
		}
	}
	return out
}

// outboxCounts reads the federation outbox of a stopped directory by state.
func outboxCounts(t *testing.T, dataDir string) map[federation.OutboxState]int64 {
	t.Helper()
	var counts map[federation.OutboxState]int64
	withOutbox(t, dataDir, func(ob *federation.Outbox) {
		var err error
		counts, err = ob.Counts(context.Background())
		require.NoError(t, err)
	})
	return counts
}

// withOutbox opens the outbox of a data directory for fn.
func withOutbox(t *testing.T, dataDir string, fn func(ob *federation.Outbox)) {
	t.Helper()
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(dataDir, "beam.db"), Logger: beamtest.Logger(t)})
	require.NoError(t, err)
	defer lg.Close()
	ob, err := federation.OpenOutbox(context.Background(), lg, nil)
	require.NoError(t, err)
	fn(ob)
}

// outboxTable is the JSON of every outbox row of a stopped directory (all
// fields but the claim token and the payload).
func outboxTable(t *testing.T, dataDir string) string {
	t.Helper()
	var out []byte
	withOutbox(t, dataDir, func(ob *federation.Outbox) {
		rows, err := ob.Rows(context.Background(), "", 1000)
		require.NoError(t, err)
		require.NotEmpty(t, rows)
		out, err = json.Marshal(rows)
		require.NoError(t, err)
	})
	return string(out)
}

// TestFederationDurableProcesses is the process-level acceptance test of
// durable sends across directories: with the target directory stopped, N
// durable intents are accepted into alpha's outbox; when beta returns all
// of them end acked at alpha, each delivered once to the agent. Then alpha
// is SIGKILLed while its relay has publishes in flight (claimed rows whose
// reply is pending) and rows still pending; after the restart nothing is
// lost and nothing reaches the agent twice.
func TestFederationDurableProcesses(t *testing.T) {
	t.Parallel()
	n := *fedDurableCount
	if testing.Short() {
		n = min(n, 20)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	alphaDir, betaDir := t.TempDir(), t.TempDir()
	alphaNATS, betaNATS := freeAddr(t), freeAddr(t)
	alphaLine := showSelf(t, alphaDir, "alpha.beam.directory", alphaNATS)
	betaLine := showSelf(t, betaDir, "beta.beam.directory", betaNATS)
	common := []string{"--default-policy", "allow", "--bus-tick-interval", "100ms", "--bus-delivery-timeout", "60s"}
	alpha := beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: append([]string{"--domain", "alpha.beam.directory",
		"--nats-listen", alphaNATS, "--peer", betaLine}, common...)})
	beta := beamtest.Start(t, beamtest.Options{DataDir: betaDir, Args: append([]string{"--domain", "beta.beam.directory",
		"--nats-listen", betaNATS, "--peer", alphaLine}, common...)})

	aID, sender := sdkAgent(t, ctx, alpha.URL(), "a@alpha.beam.directory")
	bID, b1 := sdkAgent(t, ctx, beta.URL(), "b@beta.beam.directory")
	counter := &deliveryCounter{seen: map[string]int{}, attested: map[string]string{}, held: make(chan struct{}, 1)}
	b1.Handle("*", counter.handle)
	require.NoError(t, b1.Connect(ctx))

	// Phase 1: the target is down while the intents are sent, signed ones
	// and one authenticated by the sender's API key, which alpha vouches for.
	beta.Stop()
	_ = b1.Close()
	phase1 := make([]string, 0, n+1)
	for i := range n {
		rec, err := sender.SendDurable(ctx, bID.BeamID, "task.run", map[string]any{"i": i}, nil)
		require.NoError(t, err)
		require.Contains(t, []string{"dispatched", "queued"}, rec.Status, "accepted into the outbox")
		phase1 = append(phase1, rec.Nonce)
	}
	status, body := busCall(t, ctx, http.MethodPost, alpha.URL()+"/v1/beam/send", aID.APIKey,
		`{"from":"a@alpha.beam.directory","to":"b@beta.beam.directory","intent":"task.run","payload":{"apiKey":true}}`)
	require.Equal(t, http.StatusCreated, status, body)
	var apiSend struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &apiSend), body)
	phase1 = append(phase1, apiSend.Nonce)
	require.Equal(t, n+1, messageStates(alphaDir, phase1)[tracing.Dispatched], "every message waits in the outbox")
	beta.Restart()
	b2 := sdkClient(t, beta.URL(), bID)
	b2.Handle("*", counter.handle)
	require.NoError(t, b2.Connect(ctx))
	require.Eventually(t, func() bool {
		return messageStates(alphaDir, phase1)[tracing.Acked] == n+1
	}, 4*time.Minute, 250*time.Millisecond, "every message ends acked at the origin after the target returned")
	counter.requireOnce(t, phase1)
	counter.mu.Lock()
	require.Equal(t, wire.AttestPeer+" by beta.beam.directory, vouched by alpha.beam.directory", counter.attested[apiSend.Nonce],
		"the API-key send is delivered attested by beta, vouched for by alpha")
	require.Empty(t, counter.attested[phase1[0]], "a signed frame travels verbatim")
	counter.mu.Unlock()

	// Phase 2: SIGKILL alpha while publishes are in flight.
	hold := make(chan struct{})
	counter.mu.Lock()
	counter.hold = hold
	counter.mu.Unlock()
	phase2 := make([]string, 0, n)
	for i := range n {
		rec, err := sender.SendDurable(ctx, bID.BeamID, "task.run", map[string]any{"phase": 2, "i": i}, nil)
		require.NoError(t, err)
		phase2 = append(phase2, rec.Nonce)
	}
	select {
	case <-counter.held:
	case <-ctx.Done():
		t.Fatal("no forwarded intent reached the agent")
	}
	// A publish is in flight (its row CLAIMED, the agent holding the
	// intent) and later rows wait behind it.
	alpha.Kill()
	_ = sender.Close()
	st := messageStates(alphaDir, phase2)
	counts := outboxCounts(t, alphaDir)
	t.Logf("at the kill: bus messages %v, outbox %v", st, counts)
	require.Positive(t, counts[federation.Claimed], "a publish was in flight at the kill")
	require.Equal(t, n, st[tracing.Dispatched]+st[tracing.Delivered]+st[tracing.Acked], "states at the kill: %v", st)
	require.Less(t, st[tracing.Acked], n, "the kill came before every message was acked: %v", st)
	// The outbox as the killed process left it is the fold of its steps.
	before := outboxTable(t, alphaDir)
	out, err := beamtest.Run(t, ctx, "replay", "--data-dir", alphaDir)
	require.NoError(t, err, out)
	require.Contains(t, out, "federation outbox rows")
	require.Equal(t, before, outboxTable(t, alphaDir), "beam replay refolds the outbox to what the process wrote")
	counter.mu.Lock()
	counter.hold = nil
	counter.mu.Unlock()
	close(hold)

	alpha.Restart()
	require.Eventually(t, func() bool {
		return messageStates(alphaDir, phase2)[tracing.Acked] == n
	}, 4*time.Minute, 250*time.Millisecond, "every message ends acked after the origin's restart")
	alpha.Stop()
	beta.Stop()
	counter.requireOnce(t, phase2)
	counter.mu.Lock()
	require.Len(t, counter.seen, 2*n+1, "no other nonce reached the agent")
	counter.mu.Unlock()

	lg := openLog(t, alphaDir)
	for _, nonce := range append(append([]string{}, phase1...), phase2...) {
		st, ok, err := lg.State(context.Background(), nonce)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, tracing.Acked, st, nonce)
	}
	requireProjectionsEqualRebuild(t, lg)
}

// sharedNATS starts an existing-deployment NATS server configured only with
// the entries `beam peer nats-user` prints for alpha's and beta's data
// directories, and returns its URL and their peer lines.
func sharedNATS(t *testing.T, alphaDir, betaDir string) (url, alphaLine, betaLine string) {
	t.Helper()
	natsAddr := freeAddr(t)
	var users []string
	for _, d := range []struct{ dir, domain string }{{alphaDir, "alpha.beam.directory"}, {betaDir, "beta.beam.directory"}} {
		out, err := beamtest.Run(t, context.Background(), "peer", "nats-user", "--data-dir", d.dir, "--domain", d.domain)
		require.NoError(t, err, out)
		require.Contains(t, out, `nkey: "U`)
		users = append(users, out)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte("listen: "+natsAddr+"\nauthorization {\n  users = [\n"+
		strings.Join(users, "\n")+"\n  ]\n}\n"), 0o600))
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	alphaLine = showSelf(t, alphaDir, "alpha.beam.directory", natsAddr)
	betaLine = showSelf(t, betaDir, "beta.beam.directory", natsAddr)
	return "nats://" + natsAddr, alphaLine, betaLine
}

// Two beam serve processes federate through an existing NATS server
// (--nats-url) configured only with the entries `beam peer nats-user`
// prints.
func TestFederationSharedNATSProcesses(t *testing.T) {
	t.Parallel()
	alphaDir, betaDir := t.TempDir(), t.TempDir()
	url, alphaLine, betaLine := sharedNATS(t, alphaDir, betaDir)
	alpha := beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: []string{"--domain", "alpha.beam.directory",
		"--nats-url", url, "--peer", betaLine, "--default-policy", "allow"}})
	beta := beamtest.Start(t, beamtest.Options{DataDir: betaDir, Args: []string{"--domain", "beta.beam.directory",
		"--nats-url", url, "--peer", alphaLine, "--default-policy", "allow"}})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := func(url, beamID string) *agents.Client {
		id, err := agents.GenerateIdentity(beamID)
		require.NoError(t, err)
		c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: id})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = c.Register(ctx, strings.Split(beamID, "@")[0], nil)
		require.NoError(t, err)
		return c
	}
	b := client(beta.URL(), "b@beta.beam.directory")
	got := make(chan string, 4)
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in.From
		return agents.Success(map[string]any{"ok": true})
	})
	require.NoError(t, b.Connect(ctx))
	a := client(alpha.URL(), "a@alpha.beam.directory")
	res, err := a.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 1})
	require.NoError(t, err)
	require.True(t, res.Success)
	require.Equal(t, "a@alpha.beam.directory", <-got)
}
