package jobs_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestLeaseAndTokenSurviveRestart: a worker holding a claim token can still
// fulfill after a restart, an abandoned claim comes back after its lease,
// and every job reads the same before and after (the in-memory projection
// is the fold of the log).
func TestLeaseAndTokenSurviveRestart(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Env: baseEnv("BEAM_INTENT_CLAIM_TIMEOUT=10s")}) // outlasts a restart on a loaded machine
	b := &bus{p: p}
	c := b.client(t, mainKey)
	ns := uniqueNS(t)
	kept := c.publishOK(map[string]any{"goal": "keep", "payload": 1, "namespace": ns, "priority": 900})
	lost := c.publishOK(map[string]any{"goal": "lost", "payload": 2, "namespace": ns, "priority": 800, "backoff_base": 1})
	done := c.publishOK(map[string]any{"goal": "done", "payload": 3, "namespace": ns, "priority": 700})
	open := c.publishOK(map[string]any{"goal": "open", "payload": 4, "namespace": ns, "priority": 1})
	k := c.claim(ns)
	require.Equal(t, kept, k.str("id"))
	l := c.claim(ns)
	require.Equal(t, lost, l.str("id"))
	d := c.claim(ns)
	require.Equal(t, 200, c.do("POST", "/fulfill/"+d.str("id"), nil, map[string]any{"claim_token": d.str("claim_token"), "result": "r"}).status)
	require.NoError(t, c.do("POST", "/set/kv", nil, map[string]any{"value": map[string]any{"x": 1}}).err())
	before := map[string]map[string]any{}
	for _, id := range []string{kept, lost, done, open} {
		before[id] = b.admin(t, "GET", "/admin/intents/"+id, nil).body
	}

	// Signed requests captured before the restart: a read, and a publish
	// (its nonce is stored in the job's event).
	replay := signedReq(t, "GET", b.url()+"/get/kv", nil, time.Now().Unix())
	require.Equal(t, 200, send(t, replay.Clone(context.Background())).status)
	pubBody := []byte(`{"goal":"once","payload":1,"namespace":"` + ns + `-once"}`)
	replayPub := signedReq(t, "POST", b.url()+"/intent", pubBody, time.Now().Unix())
	require.Equal(t, http.StatusCreated, send(t, cloneWithBody(replayPub, pubBody)).status)
	signedAt := time.Now().Unix()
	require.Eventually(t, func() bool { return time.Now().Unix() > signedAt }, 3*time.Second, 10*time.Millisecond,
		"the restart must start in a later second than the signature")
	beforeStart := time.Now().Unix()
	p.Restart() // SIGKILL, then start on the same data directory
	for id, row := range before {
		require.Equal(t, row, b.admin(t, "GET", "/admin/intents/"+id, nil).body, id)
	}
	require.Equal(t, map[string]any{"x": 1.0}, c.do("GET", "/get/kv", nil, nil).body["value"])
	// The kept claim's token still works.
	r := c.do("POST", "/fulfill/"+kept, nil, map[string]any{"claim_token": k.str("claim_token")})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	// The lost one's lease runs out and it is claimable again.
	var again *resp
	require.Eventually(t, func() bool {
		again = c.claim(ns, [2]string{"goal", "lost"})
		return again.status == 200
	}, 40*time.Second, 100*time.Millisecond)
	require.Equal(t, lost, again.str("id"))
	require.EqualValues(t, 2, again.num("claim_attempts"))
	require.Equal(t, 404, c.do("POST", "/fulfill/"+lost, nil, map[string]any{"claim_token": l.str("claim_token")}).status)
	// Signatures made before the restart cannot be replayed into it.
	replay.URL.Host = strings.TrimPrefix(b.url(), "http://")
	rr := send(t, replay)
	require.Equal(t, http.StatusForbidden, rr.status)
	require.Equal(t, "invalid_signature", rr.code())
	require.Equal(t, "Replay detected", rr.message())
	replayPub.URL.Host = replay.URL.Host
	rp := send(t, cloneWithBody(replayPub, pubBody))
	require.Equal(t, http.StatusForbidden, rp.status, string(rp.raw))
	require.Equal(t, "Replay detected", rp.message())
	// An honest client whose clock is behind signs with a timestamp from
	// before the server's start, inside the RFC's window: accepted.
	hr := send(t, signedReq(t, "GET", b.url()+"/get/kv", nil, beforeStart-2))
	require.Equal(t, http.StatusOK, hr.status, string(hr.raw))
	require.Equal(t, open, c.claim(ns).str("id"))
}

// signedReq is a request of method to u with body, signed by the main key
// with timestamp ts (unix s) and a fresh nonce, as the SDK signs.
func signedReq(t *testing.T, method, u string, body []byte, ts int64) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	require.NoError(t, err)
	n := nonce()
	req.Header.Set("X-API-KEY", mainKey)
	req.Header.Set("X-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Nonce", n)
	req.Header.Set("X-Signature", signMsg(mainKey, method+"\n"+req.URL.Path+"\n"+strconv.FormatInt(ts, 10)+"\n"+n+"\n"+string(body)))
	return req
}

// cloneWithBody is a copy of req that sends body again.
func cloneWithBody(req *http.Request, body []byte) *http.Request {
	c := req.Clone(context.Background())
	c.Body = io.NopCloser(bytes.NewReader(body))
	c.ContentLength = int64(len(body))
	return c
}

// TestSIGKILLDuringPublishAndClaimLosesNothing kills the process under a
// publish+claim load: every intent answered 201 exists after the restart,
// and the claimed ones come back after their lease.
func TestSIGKILLDuringPublishAndClaimLosesNothing(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Env: baseEnv()})
	b := &bus{p: p}
	ns := uniqueNS(t)
	var (
		mu        sync.Mutex
		published = map[string]bool{}
		claimed   = map[string]bool{}
		killed    atomic.Bool
		wg        sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reached := make(chan struct{})
	var once sync.Once
	worker := func(pub bool) {
		defer wg.Done()
		c := &client{t: nopT{t}, base: b.url, key: mainKey, sign: true}
		for ctx.Err() == nil && !killed.Load() {
			if pub {
				r, ok := c.try("POST", "/intent", nil, map[string]any{"goal": "k", "payload": 1, "namespace": ns})
				if !ok || r.status != http.StatusCreated {
					continue
				}
				mu.Lock()
				published[r.str("id")] = true
				n := len(published)
				mu.Unlock()
				if n >= 150 {
					once.Do(func() { close(reached) })
				}
				continue
			}
			r, ok := c.try("POST", "/claim", [][2]string{{"namespace", ns}}, nil)
			if ok && r.status == http.StatusOK {
				mu.Lock()
				claimed[r.str("id")] = true
				mu.Unlock()
			}
		}
	}
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go worker(i%2 == 0)
	}
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatal("load never reached 150 publishes")
	}
	killed.Store(true)
	p.Kill()
	wg.Wait()
	p.Restart()
	c := b.client(t, mainKey)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, claimed)
	for id := range published {
		r := c.do("GET", "/status/"+id, nil, nil)
		require.Equal(t, http.StatusOK, r.status, "201'd intent %s lost", id)
		require.Contains(t, []string{"open", "claimed"}, r.str("status"))
	}
	// Every published intent can be claimed once the leases run out.
	got := map[string]bool{}
	require.Eventually(t, func() bool {
		for {
			r := c.claim(ns)
			if r.status != http.StatusOK {
				break
			}
			require.False(t, got[r.str("id")], "claimed twice")
			got[r.str("id")] = true
			require.Equal(t, 200, c.do("POST", "/fulfill/"+r.str("id"), nil, map[string]any{"claim_token": r.str("claim_token")}).status)
		}
		for id := range published {
			if !got[id] {
				return false
			}
		}
		return true
	}, 60*time.Second, 200*time.Millisecond)
}
