package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/internal/beamtest"
)

// The job bus settings of TestClusterProcesses's nodes: one admin secret,
// and a short lease so an expired claim requeues within a test.
const (
	clusterJobsAdmin = "cluster-jobs-admin-secret"
	clusterJobsLease = 8 * time.Second
)

// clusterJobsEnv is the environment of TestClusterProcesses's nodes for
// the job bus.
func clusterJobsEnv() []string {
	return []string{"BUS_ADMIN_SECRET=" + clusterJobsAdmin, "BEAM_INTENT_CLAIM_TIMEOUT=" + clusterJobsLease.String()}
}

// jobsAnswer is one answer of a job bus listener.
type jobsAnswer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// jobsReq sends a request to a node's job bus listener with hdr (values
// of "" left out) and a JSON body (nil: none).
func jobsReq(t *testing.T, ctx context.Context, node *beamtest.Process, method, path string, hdr map[string]string, body any) jobsAnswer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, node.IntentURL()+path, rd)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := jobsAnswer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(bytes.TrimSpace(raw)) > 0 {
		_ = json.Unmarshal(raw, &a.body)
	}
	return a
}

// clusterJobs is the job bus of a cluster's nodes as the tests use it.
type clusterJobs struct {
	t      *testing.T
	ctx    context.Context
	nodes  []*beamtest.Process
	secret string
	home   int // index of the home node
}

func newClusterJobs(t *testing.T, ctx context.Context, nodes []*beamtest.Process) *clusterJobs {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nodes[0].DataDir, "intent.secret"))
	require.NoError(t, err)
	cj := &clusterJobs{t: t, ctx: ctx, nodes: nodes, secret: strings.TrimSpace(string(b)), home: -1}
	home := clusterHome(t, ctx, nodes[0])
	for i, n := range nodes {
		if fmt.Sprintf("node%d", i) == home {
			cj.home = i
		}
		require.NotEmpty(t, n.IntentURL())
	}
	require.GreaterOrEqual(t, cj.home, 0, "home %q is a node of the cluster", home)
	return cj
}

// homeRow is one home as /observability/cluster shows it.
type homeRow struct {
	Name, Node string
	Live       bool
}

// clusterHomes are the homes node's /observability/cluster shows.
func clusterHomes(t *testing.T, ctx context.Context, node *beamtest.Process) []homeRow {
	t.Helper()
	var st struct {
		Homes []homeRow `json:"homes"`
	}
	require.NoError(t, clusterStatus(t, ctx, node, &st))
	return st.Homes
}

// clusterStatus reads the status of node's /observability/cluster into
// st, with the node's admin token.
func clusterStatus(t *testing.T, ctx context.Context, node *beamtest.Process, st any) error {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(node.DataDir, "admin.token"))
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, node.URL()+"/observability/cluster", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/observability/cluster: %s", resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(&struct {
		Status any `json:"status"`
	}{st})
}

// clusterHome is the job bus's home as node's /observability/cluster
// shows it, live.
func clusterHome(t *testing.T, ctx context.Context, node *beamtest.Process) string {
	t.Helper()
	homes := clusterHomes(t, ctx, node)
	require.Len(t, homes, 1, "%+v", homes)
	require.Equal(t, "jobs", homes[0].Name)
	require.True(t, homes[0].Live)
	return homes[0].Node
}

// node returns the i-th node counted from the home: 0 the home, 1 and 2
// the others.
func (cj *clusterJobs) node(i int) *beamtest.Process { return cj.nodes[(cj.home+i)%len(cj.nodes)] }

// key sends a request with API key key.
func (cj *clusterJobs) key(node *beamtest.Process, key, method, path string, body any) jobsAnswer {
	cj.t.Helper()
	return jobsReq(cj.t, cj.ctx, node, method, path, map[string]string{"X-API-KEY": key}, body)
}

// do sends a request with the bus's main key.
func (cj *clusterJobs) do(node *beamtest.Process, method, path string, body any) jobsAnswer {
	cj.t.Helper()
	return cj.key(node, cj.secret, method, path, body)
}

// admin sends an admin request.
func (cj *clusterJobs) admin(node *beamtest.Process, method, path string, body any) jobsAnswer {
	cj.t.Helper()
	return jobsReq(cj.t, cj.ctx, node, method, path, map[string]string{"X-Admin-Token": clusterJobsAdmin}, body)
}

// publish publishes a job in ns through node and returns its ID.
func (cj *clusterJobs) publish(node *beamtest.Process, ns string, n int) string {
	cj.t.Helper()
	a := cj.do(node, http.MethodPost, "/intent", map[string]any{"goal": "cluster.job", "namespace": ns, "payload": map[string]any{"n": n}})
	require.Contains(cj.t, []int{http.StatusOK, http.StatusCreated}, a.status, a.raw)
	id, _ := a.body["id"].(string)
	require.NotEmpty(cj.t, id, a.raw)
	return id
}

// claim claims from ns through node: the job's ID and claim token, or ""
// when there is nothing to claim.
func (cj *clusterJobs) claim(node *beamtest.Process, ns string) (string, string) {
	cj.t.Helper()
	a := cj.do(node, http.MethodPost, "/claim?namespace="+ns, map[string]any{})
	if a.status == http.StatusNoContent {
		return "", ""
	}
	require.Equal(cj.t, http.StatusOK, a.status, a.raw)
	id, _ := a.body["id"].(string)
	tok, _ := a.body["claim_token"].(string)
	return id, tok
}

// uniqueNS is a namespace no other test uses.
func uniqueNS(t *testing.T, prefix string) string {
	t.Helper()
	raw := make([]byte, 6)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	return prefix + "-" + hex.EncodeToString(raw)
}

// clusterJobsAcrossNodes: the Intent Protocol job bus of a cluster is one
// bus, whichever node a client talks to. A job published on the home is
// claimed through a second node and fulfilled through the third, and its
// result read where it was published and everywhere else; a claim token
// extends and fails a claim through other nodes than the claim's; KV set
// on one node is read on another; an Idempotency-Key holds across nodes;
// a signed request's nonce taken on one node is a replay on another; while
// the nodes serve, /observability/cluster shows the live home.
func clusterJobsAcrossNodes(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cj := newClusterJobs(t, ctx, nodes)
	for _, n := range nodes {
		require.Equal(t, fmt.Sprintf("node%d", cj.home), clusterHome(t, ctx, n), "every node names the same home")
	}

	t.Run("publish claim fulfil", func(t *testing.T) {
		for start := range 3 {
			cj.t = t
			ns := uniqueNS(t, "across")
			id := cj.publish(cj.node(start), ns, start)
			got, tok := cj.claim(cj.node(start+1), ns)
			require.Equal(t, id, got)
			a := cj.do(cj.node(start+2), http.MethodPost, "/fulfill/"+id, map[string]any{"claim_token": tok, "result": map[string]any{"done": start}})
			require.Equal(t, http.StatusOK, a.status, a.raw)
			for i := range 3 {
				r := cj.do(cj.node(start+i), http.MethodGet, "/result/"+id, nil)
				require.Equal(t, http.StatusOK, r.status, r.raw)
				require.Equal(t, map[string]any{"done": float64(start)}, r.body["result"], r.raw)
				require.Equal(t, "application/json", r.header.Get("Content-Type"))
				require.Equal(t, "2.1", r.header.Get("X-Intent-Version"), "the job bus's own headers come back")
			}
		}
	})

	t.Run("extend and fail elsewhere", func(t *testing.T) {
		cj.t = t
		ns := uniqueNS(t, "extend")
		id := cj.publish(cj.node(1), ns, 1)
		got, tok := cj.claim(cj.node(2), ns)
		require.Equal(t, id, got)
		a := cj.do(cj.node(0), http.MethodPost, "/extend_claim/"+id, map[string]any{"claim_token": tok, "seconds": 30})
		require.Equal(t, http.StatusOK, a.status, a.raw)
		a = cj.do(cj.node(1), http.MethodPost, "/fail/"+id, map[string]any{"claim_token": tok, "error": "try again"})
		require.Equal(t, http.StatusOK, a.status, a.raw)
		a = cj.do(cj.node(2), http.MethodPost, "/fail/"+id, map[string]any{"claim_token": tok, "error": "twice"})
		require.Equal(t, http.StatusNotFound, a.status, "a claim failed once: %s", a.raw)
		require.Equal(t, "not_found", a.body["error"].(map[string]any)["code"], a.raw)
	})

	t.Run("kv", func(t *testing.T) {
		cj.t = t
		a := cj.do(cj.node(1), http.MethodPost, "/set/cluster-kv", map[string]any{"value": map[string]any{"v": 7}})
		require.Equal(t, http.StatusOK, a.status, a.raw)
		for i := range 3 {
			g := cj.do(cj.node(i), http.MethodGet, "/get/cluster-kv", nil)
			require.Equal(t, http.StatusOK, g.status, g.raw)
			require.Equal(t, map[string]any{"v": float64(7)}, g.body["value"])
		}
	})

	t.Run("idempotency", func(t *testing.T) {
		cj.t = t
		ns := uniqueNS(t, "idem")
		body := map[string]any{"goal": "cluster.idem", "namespace": ns, "payload": map[string]any{"n": 1}}
		hdr := map[string]string{"X-API-KEY": cj.secret, "Idempotency-Key": uniqueNS(t, "idem-key")}
		var ids []string
		for i := range 3 {
			a := jobsReq(t, ctx, cj.node(i), http.MethodPost, "/intent", hdr, body)
			require.Contains(t, []int{http.StatusOK, http.StatusCreated}, a.status, a.raw)
			ids = append(ids, a.body["id"].(string))
		}
		require.Equal(t, []string{ids[0], ids[0], ids[0]}, ids, "one job for one Idempotency-Key on every node")
	})

	t.Run("signed nonce", func(t *testing.T) {
		cj.t = t
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		nonce := uniqueNS(t, "nonce")
		body := []byte(`{}`)
		sig := jobs.Sign(cj.secret, jobs.CanonicalString(http.MethodPost, "/claim", "namespace=signed-none", ts, nonce, body))
		send := func(node *beamtest.Process) jobsAnswer {
			return jobsReq(t, ctx, node, http.MethodPost, "/claim?namespace=signed-none",
				map[string]string{"X-API-KEY": cj.secret, "X-Timestamp": ts, "X-Nonce": nonce, "X-Signature": sig}, map[string]any{})
		}
		a := send(cj.node(1))
		require.Equal(t, http.StatusNoContent, a.status, a.raw)
		a = send(cj.node(2))
		require.Equal(t, http.StatusForbidden, a.status, "a signed request replayed through another node: %s", a.raw)
		require.Contains(t, a.raw, "Replay detected")
	})
}

// clusterJobsLeases: a claim whose lease expires is requeued by the home
// and claimed through another node; the expired claim's token is refused
// everywhere.
func clusterJobsLeases(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cj := newClusterJobs(t, ctx, nodes)
	ns := uniqueNS(t, "lease")
	id := cj.publish(cj.node(0), ns, 1)
	got, stale := cj.claim(cj.node(1), ns)
	require.Equal(t, id, got)
	var tok string
	require.Eventually(t, func() bool {
		got, tok = cj.claim(cj.node(2), ns)
		return got != ""
	}, clusterJobsLease+30*time.Second, 250*time.Millisecond, "the expired claim is requeued")
	require.Equal(t, id, got)
	require.NotEqual(t, stale, tok)
	a := cj.do(cj.node(0), http.MethodPost, "/fulfill/"+id, map[string]any{"claim_token": stale})
	require.Equal(t, http.StatusNotFound, a.status, "the expired claim's token: %s", a.raw)
	a = cj.do(cj.node(1), http.MethodPost, "/fulfill/"+id, map[string]any{"claim_token": tok})
	require.Equal(t, http.StatusOK, a.status, a.raw)
	r := cj.do(cj.node(2), http.MethodGet, "/status/"+id, nil)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, float64(2), r.body["claim_attempts"], r.raw)
}

// clusterJobsKeys: a tester key generated through one node's admin route
// works through the others, and revoked through one it is refused by all;
// its per-minute rate limit counts the requests of every node: spread over
// two nodes, exactly the limit passes and the next is 429 with
// Retry-After.
func clusterJobsKeys(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cj := newClusterJobs(t, ctx, nodes)
	gen := func(node *beamtest.Process, owner string) string {
		a := cj.admin(node, http.MethodPost, "/admin/generate_key", map[string]any{"owner": owner})
		require.Equal(t, http.StatusCreated, a.status, a.raw)
		return a.body["api_key"].(string)
	}

	key := gen(cj.node(1), "cluster-tester")
	ns := uniqueNS(t, "tester")
	a := cj.key(cj.node(2), key, http.MethodPost, "/intent", map[string]any{"goal": "cluster.tester", "namespace": ns, "payload": 1})
	require.Contains(t, []int{http.StatusOK, http.StatusCreated}, a.status, a.raw)
	a = cj.admin(cj.node(0), http.MethodPost, "/admin/revoke_key", map[string]any{"api_key": key})
	require.Equal(t, http.StatusOK, a.status, a.raw)
	for i := range 3 {
		a = cj.key(cj.node(i), key, http.MethodPost, "/claim?namespace="+ns, map[string]any{})
		require.Equal(t, http.StatusUnauthorized, a.status, "a revoked key through node %d: %s", i, a.raw)
	}

	limited := gen(cj.node(2), "cluster-limited")
	const limit = 60 // the default per-minute limit of a tester key
	passed, empty := 0, uniqueNS(t, "limited")
	for i := range limit + 1 {
		a := cj.key(cj.node(1+i%2), limited, http.MethodPost, "/claim?namespace="+empty, map[string]any{})
		if a.status == http.StatusTooManyRequests {
			require.NotEmpty(t, a.header.Get("Retry-After"), a.raw)
			require.Equal(t, "rate_limited", a.body["error"].(map[string]any)["code"], a.raw)
			break
		}
		require.Equal(t, http.StatusNoContent, a.status, a.raw)
		passed++
	}
	require.Equal(t, limit, passed, "requests spread over two nodes count against one limit")
}

// clusterJobsExactlyOnce: workers on all three nodes claim concurrently
// from one queue; every job is claimed exactly once.
func clusterJobsExactlyOnce(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cj := newClusterJobs(t, ctx, nodes)
	const jobsN, workersPerNode = 60, 4
	ns := uniqueNS(t, "once")
	published := map[string]bool{}
	for i := range jobsN {
		published[cj.publish(cj.node(i%3), ns, i)] = true
	}
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
		errs    = make(chan string, 3*workersPerNode)
	)
	for i := range 3 * workersPerNode {
		node := nodes[i%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				a := jobsReq(t, ctx, node, http.MethodPost, "/claim?namespace="+ns, map[string]string{"X-API-KEY": cj.secret}, map[string]any{})
				if a.status == http.StatusNoContent {
					return
				}
				if a.status != http.StatusOK {
					errs <- fmt.Sprintf("claim: %d %s", a.status, a.raw)
					return
				}
				id, tok := a.body["id"].(string), a.body["claim_token"].(string)
				mu.Lock()
				claimed[id]++
				mu.Unlock()
				f := jobsReq(t, ctx, node, http.MethodPost, "/fulfill/"+id, map[string]string{"X-API-KEY": cj.secret},
					map[string]any{"claim_token": tok, "result": "ok"})
				if f.status != http.StatusOK {
					errs <- fmt.Sprintf("fulfil: %d %s", f.status, f.raw)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		require.Fail(t, e)
	}
	require.Len(t, claimed, jobsN)
	for id, n := range claimed {
		require.True(t, published[id], "claimed %s, never published", id)
		require.Equal(t, 1, n, "job %s claimed %d times", id, n)
	}
}

// clusterJobsForgery: the job bus's calls between nodes carry clients'
// credentials, so they are sealed and taken once. A NATS client with
// every publish right of the cluster but without the directory key
// captures a real call to the home and sends it again, as it is and with
// another client's headers (a stolen API key in place of the sealed one),
// and sends a call sealed by another key: the home answers each 401 and
// acts on none (the second job stays queued). An HTTP request carrying the
// node call header is refused 401 by every node's job bus listener.
func clusterJobsForgery(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cj := newClusterJobs(t, ctx, nodes)
	nc := memberClient(t, cj.node(0))
	home := fmt.Sprintf("node%d", cj.home)
	subject := "beam.cluster." + cluster.Token(clusterDomain) + ".node." + home + ".jobs"

	ns := uniqueNS(t, "forge")
	first := cj.publish(cj.node(1), ns, 1)
	second := cj.publish(cj.node(1), ns, 2)

	captured := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subject, captured)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	got, _ := cj.claim(cj.node(2), ns)
	require.Equal(t, first, got)
	var call *nats.Msg
	require.Eventually(t, func() bool {
		for {
			select {
			case m := <-captured:
				if strings.Contains(sealPayload(m.Header.Get("Beam-Cluster-Seal")), ns) {
					call = m
				}
			default:
				return call != nil
			}
		}
	}, 10*time.Second, 50*time.Millisecond, "the claim through node 2 is a call to the home")
	require.NoError(t, sub.Unsubscribe())

	refused := func(m *nats.Msg, what string) {
		t.Helper()
		answer, err := nc.RequestMsg(m, 20*time.Second)
		require.NoError(t, err, what)
		require.Contains(t, string(answer.Data), "not signed by a member", "%s was answered: %s", what, answer.Data)
	}
	refused(&nats.Msg{Subject: subject, Header: call.Header, Data: call.Data}, "a replayed call")

	stolen := nats.Header{}
	for k, v := range call.Header {
		stolen[k] = v
	}
	stolen.Set("Beam-Jobs-Headers", `{"X-Api-Key":["tk_stolen"]}`)
	refused(&nats.Msg{Subject: subject, Header: stolen, Data: call.Data}, "a call with other headers")

	payload, err := json.Marshal(map[string]any{"jti": uniqueNS(t, "forged-call"), "to": home, "method": "POST",
		"path": "/claim", "query": "namespace=" + ns, "body": sha256Hex(call.Data),
		"headers": sha256Hex([]byte(call.Header.Get("Beam-Jobs-Headers"))),
		"iat":     time.Now().Unix(), "exp": time.Now().Add(30 * time.Second).Unix()})
	require.NoError(t, err)
	forged := nats.Header{}
	for k, v := range call.Header {
		forged[k] = v
	}
	forged.Set("Beam-Cluster-Seal", string(forgedJWS(t, "beam-cluster-jobs-call+jws", payload)))
	refused(&nats.Msg{Subject: subject, Header: forged, Data: call.Data}, "a call sealed by another key")

	got, _ = cj.claim(cj.node(1), ns)
	require.Equal(t, second, got, "no refused call claimed the second job")

	for i, n := range nodes {
		a := jobsReq(t, ctx, n, http.MethodPost, "/claim?namespace="+ns,
			map[string]string{"X-API-KEY": cj.secret, "X-Beam-Cluster-Call": call.Header.Get("Beam-Cluster-Seal")}, map[string]any{})
		require.Equal(t, http.StatusUnauthorized, a.status, "a node call over HTTP to node %d: %s", i, a.raw)
	}
}

// sealPayload is the payload of a compact JWS, unverified ("" if tok is
// none).
func sealPayload(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	return string(payload)
}

// TestClusterJobsHomeDownProcesses: while the job bus's home is down the
// other nodes answer its clients 503 with Retry-After in the protocol's
// error shape (nothing is accepted that the home would not hold); once the
// home is back, the jobs it held are claimable through any node again.
func TestClusterJobsHomeDownProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	opts := clusterOptions(t, 3, withoutTakeover()...)
	for i := range opts {
		opts[i].Env = append(opts[i].Env, clusterJobsEnv()...)
	}
	nodes := beamtest.StartAll(t, opts...)
	cj := newClusterJobs(t, ctx, nodes)
	ns := uniqueNS(t, "down")
	id := cj.publish(cj.node(1), ns, 1)

	cj.node(0).Kill()
	for _, i := range []int{1, 2} {
		a := cj.do(cj.node(i), http.MethodPost, "/claim?namespace="+ns, map[string]any{})
		require.Equal(t, http.StatusServiceUnavailable, a.status, "node %d while the home is down: %s", i, a.raw)
		require.Equal(t, "5", a.header.Get("Retry-After"))
		require.Equal(t, "home_unavailable", a.body["error"].(map[string]any)["code"], a.raw)
	}
	// Also once the home's entry expired from the nodes bucket.
	require.Eventually(t, func() bool {
		homes := clusterHomes(t, ctx, cj.node(1))
		return len(homes) == 1 && !homes[0].Live
	}, 30*time.Second, 250*time.Millisecond, "node 1 sees the home down")
	a := cj.do(cj.node(2), http.MethodGet, "/status/"+id, nil)
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
	require.Equal(t, "5", a.header.Get("Retry-After"))

	cj.node(0).Restart()
	var got string
	require.Eventually(t, func() bool {
		a := cj.do(cj.node(2), http.MethodPost, "/claim?namespace="+ns, map[string]any{})
		if a.status == http.StatusOK {
			got, _ = a.body["id"].(string)
			return true
		}
		return false
	}, time.Minute, 250*time.Millisecond, "the home is back")
	require.Equal(t, id, got)
}
