package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

// takeoverRow is one takeover as /observability/cluster shows it.
type takeoverRow struct {
	Log        string         `json:"log"`
	Node       string         `json:"node"`
	Taker      string         `json:"taker"`
	State      string         `json:"state"`
	Adopted    map[string]int `json:"adopted"`
	DurationMS int64          `json:"durationMs"`
}

// clusterTakeovers are the takeovers node's /observability/cluster shows
// (nil when it does not answer).
func clusterTakeovers(t *testing.T, ctx context.Context, node *beamtest.Process) []takeoverRow {
	t.Helper()
	var st struct {
		Takeovers []takeoverRow `json:"takeovers"`
	}
	if clusterStatus(t, ctx, node, &st) != nil {
		return nil
	}
	return st.Takeovers
}

// waitTakeover waits until a survivor lists the takeover of node's log
// done and returns it and the survivor that took it over.
func waitTakeover(t *testing.T, ctx context.Context, survivors map[string]*beamtest.Process, node string, since time.Time, within time.Duration) (takeoverRow, *beamtest.Process) {
	t.Helper()
	var (
		row   takeoverRow
		taker *beamtest.Process
	)
	require.Eventually(t, func() bool {
		for _, p := range survivors {
			for _, r := range clusterTakeovers(t, ctx, p) {
				if r.Node == node && r.State == "done" {
					if tp, ok := survivors[r.Taker]; ok {
						row, taker = r, tp
						return true
					}
				}
			}
		}
		return false
	}, within, 100*time.Millisecond, "a survivor took %s's log over", node)
	t.Logf("%s killed → takeover by %s done: %s (import and adoption %d ms, adopted %v)",
		node, row.Taker, time.Since(since).Round(100*time.Millisecond), row.DurationMS, row.Adopted)
	return row, taker
}

// credentialFiles are what a node needs to join its cluster again with an
// empty data directory: its node ID, the directory key and the route
// credentials.
var credentialFiles = []string{cluster.NodeIDFile, federation.KeyFile, "cluster-ca.pem", "cluster-node.pem",
	cluster.CertKeyFile, cluster.SecretFile, "intent.secret"}

// wipeDataDir deletes dir and makes it again holding only its credentials.
func wipeDataDir(t *testing.T, dir string) {
	t.Helper()
	kept := map[string][]byte{}
	for _, f := range credentialFiles {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err, f)
		kept[f] = b
	}
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	for f, b := range kept {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o600))
	}
}

// counter counts the intents an agent received, by nonce.
type counter struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *counter) handler(_ context.Context, in *agents.Intent) agents.Reply {
	c.mu.Lock()
	c.seen[in.Nonce]++
	c.mu.Unlock()
	return agents.Success(map[string]any{"ok": true})
}

func (c *counter) count(nonce string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[nonce]
}

// TestClusterTakeoverProcesses: three `beam serve --cluster` nodes; the job
// bus's home X acknowledges a durable message to an offline agent, a job
// nobody claimed and one claimed and not fulfilled, and an envelope whose
// actor is offline; X is SIGKILLed and its data directory deleted. Within
// 30 s a survivor has taken X's log over (done, with adopted counts on
// /observability/cluster) and is the job bus's home; the message reaches
// its recipient on a survivor once, both jobs are fulfilled once through
// survivors (the claimed one with its old claim token), the envelope
// finishes once its actor connects to a survivor, and `beam trace` on the
// taker shows the message's history from X (with its takenOver detail) and
// the takeover. X comes back with its credentials and an empty data
// directory and serves as a fresh member. Then another node is killed with
// its data kept, taken over while down, and restarted: it sets its old log
// aside, serves with a new log and delivers nothing of the old one again.
func TestClusterTakeoverProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	opts := clusterOptions(t, 3, "--bus-tick-interval", "100ms", "--bus-retry-schedule", "200ms,500ms,1s",
		"--bus-max-attempts", "500")
	for i := range opts {
		// A lease that outlasts the takeover: the claimed job's worker
		// fulfils it on a survivor with its old claim token.
		opts[i].Env = append(opts[i].Env, append(clusterJobsEnv(), "BEAM_INTENT_CLAIM_TIMEOUT=2m")...)
	}
	nodes := beamtest.StartAll(t, opts...)
	byName := func(skip ...*beamtest.Process) map[string]*beamtest.Process {
		m := map[string]*beamtest.Process{}
		for i, n := range nodes {
			skipped := false
			for _, s := range skip {
				skipped = skipped || s == n
			}
			if !skipped {
				m["node"+string(rune('0'+i))] = n
			}
		}
		return m
	}
	cj := newClusterJobs(t, ctx, nodes)
	x := cj.node(0)
	xName := "node" + string(rune('0'+cj.home))
	other := cj.node(1)

	// (a) a durable message acknowledged by X to an offline recipient.
	senderID, _ := sdkAgent(t, ctx, x.URL(), "to-sender@"+clusterDomain)
	recipientID, _ := sdkAgent(t, ctx, other.URL(), "to-recipient@"+clusterDomain)
	rec, err := sdkClient(t, x.URL(), senderID).SendDurable(ctx, recipientID.BeamID, "task.takeover", map[string]any{"n": 1}, nil)
	require.NoError(t, err)
	// (b) a job published on the home, and one claimed there and not
	// fulfilled.
	ns := uniqueNS(t, "takeover")
	jobA, jobB := cj.publish(x, ns, 1), cj.publish(x, ns, 2)
	claimedID, claimTok := cj.claim(x, ns)
	require.Contains(t, []string{jobA, jobB}, claimedID)
	open := jobA
	if claimedID == jobA {
		open = jobB
	}
	// (c) an envelope created on X whose actor is offline.
	on := func(p *beamtest.Process) *trustStack { return &trustStack{t: t, p: p, ctx: ctx} }
	creator := on(x).agent("to-creator@"+clusterDomain, false, nil)
	actorID, _ := sdkAgent(t, ctx, other.URL(), "to-actor@"+clusterDomain)
	envID := on(x).create(creator.Identity, actorID.BeamID)
	on(x).waitingOffline(creator.Identity, envID)
	// And, per other node, one whose hop is dispatched to an actor
	// connected there that holds it without answering until X is gone:
	// the taker hands the hop again — to its own actor, or to the other
	// node while that node still delivers the first attempt — and the
	// envelope finishes once.
	release := make(chan struct{})
	held := &counter{seen: map[string]int{}}
	var (
		holds    sync.WaitGroup
		holders  []*agents.Client
		heldEnvs = map[string]string{} // by the holder's node
	)
	for i := 1; i <= 2; i++ {
		holderID, holder := sdkAgent(t, ctx, cj.node(i).URL(), fmt.Sprintf("to-holder%d@%s", i, clusterDomain))
		holds.Add(1)
		holder.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
			held.mu.Lock()
			held.seen[in.Nonce]++
			first := held.seen[in.Nonce] == 1
			held.mu.Unlock()
			if first {
				holds.Done()
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return agents.Success(map[string]any{"mesh": map[string]any{"outputs": []any{}}})
		})
		require.NoError(t, holder.Connect(ctx))
		holders = append(holders, holder)
		heldEnvs[fmt.Sprintf("node%d", (cj.home+i)%len(nodes))] = on(x).create(creator.Identity, holderID.BeamID)
	}
	holds.Wait()
	_ = creator.c.Close()

	killed := time.Now()
	x.Kill()
	wipeDataDir(t, x.DataDir)
	survivors := byName(x)
	row, taker := waitTakeover(t, ctx, survivors, xName, killed, 30*time.Second)
	require.Equal(t, 1, row.Adopted["bus"], "%+v", row)
	require.Equal(t, 2, row.Adopted["jobs"], "%+v", row)
	// The envelope waiting for its offline actor may be picked up by the
	// taker's engine between the import and the adoption: it is then
	// driven by the taker all the same, without a marker of its own.
	require.GreaterOrEqual(t, row.Adopted["mesh"], 2, "%+v", row)
	// The taker hands the hop held on the other survivor to that node
	// while it still delivers the first attempt: the hop waits, it does not
	// fail the envelope.
	remote := ""
	for node, id := range heldEnvs {
		if node != row.Taker {
			remote = id
		}
	}
	require.Eventually(t, func() bool {
		status, _, out := on(taker).call(creator.APIKey, http.MethodGet, "/api/v1/mesh/"+remote+"/trace", nil)
		require.Equal(t, http.StatusOK, status, string(out))
		return strings.Contains(string(out), "nonce is busy")
	}, 15*time.Second, 100*time.Millisecond)
	close(release)
	for _, id := range heldEnvs {
		on(taker).succeeded(creator.Identity, id)
	}
	require.Eventually(t, func() bool {
		homes := clusterHomes(t, ctx, taker)
		return len(homes) == 1 && homes[0].Node == row.Taker && homes[0].Live
	}, 10*time.Second, 100*time.Millisecond, "the job bus's home moved to the taker")

	// The message reaches its recipient, on a survivor, once.
	recv := &counter{seen: map[string]int{}}
	rc := sdkClient(t, other.URL(), recipientID)
	rc.Handle("*", recv.handler)
	require.NoError(t, rc.Connect(ctx))
	require.Eventually(t, func() bool {
		st, err := queryState(t, taker.DataDir, rec.Nonce)
		return err == nil && st == tracing.Acked
	}, 30*time.Second, 100*time.Millisecond, "the taken-over message ends acked: %v", traceTransports(t, taker.DataDir, rec.Nonce))
	require.Equal(t, 1, recv.count(rec.Nonce))

	// The jobs: the open one claimable and fulfilled through a survivor,
	// the claimed one fulfilled with its old claim token.
	cj.home = -1
	for name, p := range survivors {
		if name == row.Taker {
			continue
		}
		// Once the takeover is done, every node serves the job bus again
		// at once, whether or not its watch told it yet where the home
		// moved.
		id, tok := cj.claim(p, ns)
		require.Equal(t, open, id)
		a := cj.do(p, http.MethodPost, "/fulfill/"+id, map[string]any{"claim_token": tok, "result": "ok"})
		require.Equal(t, http.StatusOK, a.status, a.raw)
		a = cj.do(p, http.MethodPost, "/fulfill/"+claimedID, map[string]any{"claim_token": claimTok, "result": "ok"})
		require.Equal(t, http.StatusOK, a.status, a.raw)
		a = cj.do(taker, http.MethodPost, "/fulfill/"+claimedID, map[string]any{"claim_token": claimTok, "result": "again"})
		require.NotEqual(t, http.StatusOK, a.status, "fulfilled twice: %s", a.raw)
		id, _ = cj.claim(p, ns)
		require.Empty(t, id, "nothing left to claim")
	}

	// The envelope finishes once its actor connects to a survivor.
	actor := sdkClient(t, other.URL(), actorID)
	hops := &counter{seen: map[string]int{}}
	actor.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		hops.handler(ctx, in)
		return agents.Success(map[string]any{"mesh": map[string]any{"outputs": []any{}}})
	})
	require.NoError(t, actor.Connect(ctx))
	on(taker).succeeded(creator.Identity, envID)
	hops.mu.Lock()
	require.Len(t, hops.seen, 1, "one hop")
	hops.mu.Unlock()

	// beam trace on the taker: X's events with their takenOver detail,
	// the takeover, and the delivery that followed.
	out, err := beamtest.Run(t, ctx, "trace", "--json", "--url", taker.URL(), "--data-dir", taker.DataDir, rec.Nonce)
	require.NoError(t, err, out)
	var evs []tracing.Event
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue // what it tells on stderr
		}
		var ev tracing.Event
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		evs = append(evs, ev)
	}
	require.NotEmpty(t, evs)
	from, _ := evs[0].Details.Extra["takenOver"].(map[string]any)
	require.NotNil(t, from, "the first event was written on X: %s", out)
	require.Equal(t, row.Log, from["log"])
	require.Equal(t, xName, from["node"])
	var marker, acked bool
	for _, ev := range evs {
		_, imported := ev.Details.Extra["takenOver"]
		require.True(t, imported || marker || ev.Transport == tracing.TransportTakeover,
			"every event before the takeover was written on X: %s", out)
		marker = marker || ev.Transport == tracing.TransportTakeover
		acked = acked || (marker && ev.State == tracing.Acked && !imported)
	}
	require.True(t, marker, "the takeover marker: %s", out)
	require.True(t, acked, "the delivery after the takeover: %s", out)

	t.Run("Dashboard", func(t *testing.T) { takeoverDashboard(t, taker, row, rec.Nonce) })

	held.mu.Lock()
	require.Len(t, held.seen, 2, "one hop per envelope, handed again by the taker: %v", held.seen)
	held.mu.Unlock()
	for _, h := range holders {
		_ = h.Close()
	}

	// X comes back with its credentials and an empty data directory: a
	// fresh member with a new log.
	x.Restart()
	require.Equal(t, http.StatusOK, agentStatus(t, ctx, x.URL(), senderID.BeamID))
	require.Empty(t, traceTransports(t, x.DataDir, rec.Nonce))

	// Another node dies with its data kept and stays down past its
	// takeover; restarted, it sets its old log aside and delivers nothing
	// of it again.
	y := other
	yName := ""
	for name, p := range byName() {
		if p == y {
			yName = name
		}
	}
	// A message y acknowledged for an agent that then connects to the
	// taker only.
	late, _ := sdkAgent(t, ctx, y.URL(), "to-late@"+clusterDomain)
	rec2, err := sdkClient(t, y.URL(), senderID).SendDurable(ctx, late.BeamID, "task.takeover", map[string]any{"n": 2}, nil)
	require.NoError(t, err)
	_ = rc.Close()
	_ = actor.Close()
	killed = time.Now()
	y.Kill()
	survivors = byName(y)
	// The 30 s hold while a quorum of each stream's replicas is up and
	// caught up: X, back with an empty store, may still be catching up, so
	// the fence can wait for the log stream to elect a leader.
	row2, taker2 := waitTakeover(t, ctx, survivors, yName, killed, 45*time.Second)
	require.Equal(t, 1, row2.Adopted["bus"], "%+v", row2)
	lateRecv := &counter{seen: map[string]int{}}
	lc := sdkClient(t, taker2.URL(), late)
	lc.Handle("*", lateRecv.handler)
	require.NoError(t, lc.Connect(ctx))
	require.Eventually(t, func() bool { return lateRecv.count(rec2.Nonce) == 1 }, 30*time.Second, 100*time.Millisecond)

	y.Restart()
	aside, err := filepath.Glob(filepath.Join(y.DataDir, "beam.db.taken-over-*"))
	require.NoError(t, err)
	require.NotEmpty(t, aside, "the old log is set aside")
	require.Equal(t, http.StatusOK, agentStatus(t, ctx, y.URL(), late.BeamID))
	require.Empty(t, traceTransports(t, y.DataDir, rec2.Nonce), "the new log holds nothing of the old")
	// A fresh message through the restarted node arrives; the old one was
	// not delivered again.
	rec3, err := sdkClient(t, y.URL(), senderID).SendDurable(ctx, late.BeamID, "task.after", nil, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return lateRecv.count(rec3.Nonce) == 1 }, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, 1, lateRecv.count(rec2.Nonce))
}

// takeoverDashboard: the taker's dashboard lists the takeover on the
// Federation page (its node, taker, state and what it adopted) and the job
// bus's home there, and the trace page of a taken-over message shows the
// events written on the lost node, each naming it.
func takeoverDashboard(t *testing.T, taker *beamtest.Process, row takeoverRow, nonce string) {
	ctx := browsertest.Start(t)
	token, err := os.ReadFile(filepath.Join(taker.DataDir, "admin.token"))
	require.NoError(t, err)
	browsertest.Run(t, ctx, 20*time.Second,
		chromedp.Navigate(taker.URL()+"/dashboard/login"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), strings.TrimSpace(string(token))),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))

	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(taker.URL()+"/dashboard/#/federation"))
	sel := `#cluster-takeovers tr[data-log="` + row.Log + `"][data-state="done"]`
	browsertest.WaitJS(t, ctx, 15*time.Second, `document.querySelector('`+sel+`')`)
	text := browsertest.Eval[string](t, ctx, `document.querySelector('`+sel+`').textContent`)
	require.Contains(t, text, row.Node)
	require.Contains(t, text, row.Taker)
	require.Contains(t, browsertest.Eval[string](t, ctx, `document.querySelector('`+sel+` [data-col="adopted"]').textContent`), "bus 1")
	require.Contains(t, browsertest.Eval[string](t, ctx, `document.querySelector('#cluster-homes tr[data-home="jobs"]').textContent`), row.Taker)

	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(taker.URL()+"/dashboard/#/intents/"+nonce))
	browsertest.WaitJS(t, ctx, 15*time.Second, `document.querySelectorAll('#timeline .taken-over[data-node="`+row.Node+`"]').length >= 2`)
	require.Contains(t, browsertest.Eval[string](t, ctx, `document.querySelector('#timeline').textContent`), "transport: takeover")
}
