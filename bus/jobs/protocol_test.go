package jobs_test

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProtocol runs the RFC's rules against one real beam serve process,
// one subtest per rule; each subtest works in its own namespace.
func TestProtocol(t *testing.T) {
	t.Parallel()
	b := startBus(t)

	t.Run("HealthNeedsNoAuth", func(t *testing.T) {
		t.Parallel()
		r := (&client{t: t, base: b.url}).do("GET", "/health", nil, nil)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, true, r.body["ok"])
		require.Greater(t, r.num("ts"), 1e9)
	})

	t.Run("ErrorsHaveShapeAndHeaders", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		cases := []struct {
			name, method, path string
			body               any
			status             int
			code               string
			key                string
		}{
			{"unknown route", "GET", "/nope", nil, 404, "not_found", mainKey},
			{"unknown route without key", "GET", "/nope/deeper", nil, 404, "not_found", ""},
			{"wrong method", "GET", "/intent", nil, 405, "method_not_allowed", mainKey},
			{"wrong method on claim", "DELETE", "/claim", nil, 405, "method_not_allowed", mainKey},
			{"missing key", "POST", "/intent", map[string]any{"goal": "g", "payload": 1}, 401, "unauthorized", ""},
			{"unknown key", "POST", "/intent", map[string]any{"goal": "g", "payload": 1}, 401, "unauthorized", "nope"},
			{"malformed JSON", "POST", "/intent", []byte(`{"goal":`), 400, "invalid_json", mainKey},
			{"not an object", "POST", "/intent", []byte(`[1,2]`), 400, "invalid_request", mainKey},
			{"body over 8 KB", "POST", "/intent", []byte(`{"goal":"g","payload":"` + strings.Repeat("x", 8200) + `"}`), 413, "body_too_large", mainKey},
			{"admin without credentials", "GET", "/admin/dead", nil, 401, "unauthorized", ""},
		}
		for _, tc := range cases {
			cc := *c
			cc.key = tc.key
			r := cc.do(tc.method, tc.path, nil, tc.body)
			require.Equal(t, tc.status, r.status, tc.name+": "+string(r.raw))
			require.Equal(t, tc.code, r.code(), tc.name)
		}
	})

	t.Run("FieldRulesReject", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		base := func(k string, v any) map[string]any {
			m := map[string]any{"goal": "g", "payload": map[string]any{"a": 1}}
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
			return m
		}
		cases := []struct {
			field string
			value any
			code  string
		}{
			{"goal", nil, "invalid_request"},
			{"payload", nil, "invalid_request"},
			{"goal", 123, "invalid_goal"},
			{"goal", "", "invalid_goal"},
			{"goal", strings.Repeat("é", 257), "invalid_goal"},
			{"namespace", "bad ns", "invalid_namespace"},
			{"namespace", strings.Repeat("n", 65), "invalid_namespace"},
			{"namespace", 7, "invalid_namespace"},
			{"visibility", "secret", "invalid_visibility"},
			{"priority", 1001, "invalid_priority"},
			{"priority", -1, "invalid_priority"},
			{"priority", 5.5, "invalid_priority"},
			{"priority", "5", "invalid_priority"},
			{"delay", -1, "invalid_delay"},
			{"delay", 86401, "invalid_delay"},
			{"max_attempts", 0, "invalid_max_attempts"},
			{"max_attempts", 21, "invalid_max_attempts"},
			{"backoff_base", 0.5, "invalid_backoff_base"},
			{"backoff_base", 3601, "invalid_backoff_base"},
			{"target_worker", "w w", "invalid_target_worker"},
			{"target_worker", 5, "invalid_target_worker"},
			{"required_capability", "", "invalid_required_capability"},
		}
		for _, tc := range cases {
			r := c.publish(base(tc.field, tc.value))
			require.Equal(t, http.StatusBadRequest, r.status, "%s=%v: %s", tc.field, tc.value, r.raw)
			require.Equal(t, tc.code, r.code(), "%s=%v", tc.field, tc.value)
		}
		big := c.publish(base("payload", strings.Repeat("x", 7200)))
		require.Equal(t, http.StatusRequestEntityTooLarge, big.status, string(big.raw))
		require.Equal(t, "payload_too_large", big.code())
		// The boundary values are accepted as they are.
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": strings.Repeat("é", 256), "payload": true, "namespace": ns,
			"priority": 1000, "max_attempts": 20, "backoff_base": 3600, "delay": 0, "visibility": "public"})
		st := c.do("GET", "/status/"+id, nil, nil)
		require.Equal(t, http.StatusOK, st.status)
		require.EqualValues(t, 1000, st.num("priority"))
		require.Equal(t, "public", st.str("visibility"))
	})

	t.Run("ConcurrentClaimsNeverDuplicate", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		const n = 300
		published := map[string]bool{}
		for i := 0; i < n; i++ {
			published[c.publishOK(map[string]any{"goal": "dup", "payload": i, "namespace": ns})] = true
		}
		var mu sync.Mutex
		seen := map[string]int{}
		var wg sync.WaitGroup
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					r := c.claim(ns)
					if r.status == http.StatusNoContent {
						require.Equal(t, "1", r.header.Get("Retry-After"))
						return
					}
					require.Equal(t, http.StatusOK, r.status, string(r.raw))
					id := r.str("id")
					mu.Lock()
					seen[id]++
					mu.Unlock()
					f := c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": r.str("claim_token")})
					require.Equal(t, http.StatusOK, f.status, string(f.raw))
				}
			}()
		}
		wg.Wait()
		require.Len(t, seen, n)
		for id, k := range seen {
			require.Equal(t, 1, k, "claimed twice: %s", id)
			require.True(t, published[id])
		}
	})

	t.Run("ClaimResponseShape", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "shape", "payload": map[string]any{"m": "hi"}, "namespace": ns})
		r := c.claim(ns)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, id, r.str("id"))
		require.Equal(t, ns, r.str("namespace"))
		require.Equal(t, "shape", r.str("goal"))
		require.Equal(t, map[string]any{"m": "hi"}, r.body["payload"])
		require.EqualValues(t, 1, r.num("claim_attempts"))
		require.EqualValues(t, 100, r.num("priority"))
		require.Contains(t, r.body, "target_worker")
		require.Nil(t, r.body["target_worker"])
		require.Regexp(t, `^[0-9a-f]{32}$`, r.str("claim_token"))
		require.EqualValues(t, 2, r.num("claim_timeout"))
	})

	t.Run("StaleOrOverwrittenTokenGets404", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "stale", "payload": 1, "namespace": ns, "backoff_base": 1, "max_attempts": 3})
		first := c.claim(ns)
		require.Equal(t, http.StatusOK, first.status)
		oldTok := first.str("claim_token")
		// A wrong token and another key's call are refused.
		require.Equal(t, 404, c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": strings.Repeat("0", 32)}).status)
		other := b.client(t, b.newKey(t, "other"))
		require.Equal(t, 404, other.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": oldTok}).status)
		// The lease runs out, the job comes back after its backoff and is
		// claimed again: the first token is dead everywhere.
		var second *resp
		require.Eventually(t, func() bool {
			second = c.claim(ns)
			return second.status == http.StatusOK
		}, 20*time.Second, 100*time.Millisecond)
		require.Equal(t, id, second.str("id"))
		require.EqualValues(t, 2, second.num("claim_attempts"))
		require.NotEqual(t, oldTok, second.str("claim_token"))
		for _, path := range []string{"/extend_claim/", "/fail/", "/fulfill/"} {
			r := c.do("POST", path+id, nil, map[string]any{"claim_token": oldTok})
			require.Equal(t, http.StatusNotFound, r.status, path)
			require.Equal(t, "not_found", r.code())
		}
		ok := c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": second.str("claim_token"), "result": "done", "result_type": "text"})
		require.Equal(t, http.StatusOK, ok.status)
		// A token is single use: fulfilled means gone.
		require.Equal(t, 404, c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": second.str("claim_token")}).status)
	})

	t.Run("ExtendBeforeAndAfterExpiry", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "ext", "payload": 1, "namespace": ns, "backoff_base": 100})
		cl := c.claim(ns)
		tok := cl.str("claim_token")
		for _, bad := range []any{9, 3601, "60"} {
			r := c.do("POST", "/extend_claim/"+id, nil, map[string]any{"claim_token": tok, "seconds": bad})
			require.Equal(t, 400, r.status)
			require.Equal(t, "invalid_seconds", r.code())
		}
		require.Equal(t, "invalid_request", c.do("POST", "/extend_claim/"+id, nil, map[string]any{"seconds": 10}).code())
		before := c.do("GET", "/status/"+id, nil, nil).num("claim_expires_at")
		r := c.do("POST", "/extend_claim/"+id, nil, map[string]any{"claim_token": tok, "seconds": 10})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		require.Equal(t, true, r.body["ok"])
		require.EqualValues(t, 10, r.num("extended_by"))
		after := c.do("GET", "/status/"+id, nil, nil).num("claim_expires_at")
		require.Greater(t, after, before+5)

		id2 := c.publishOK(map[string]any{"goal": "ext2", "payload": 1, "namespace": ns, "backoff_base": 100})
		cl2 := c.claim(ns, [2]string{"goal", "ext2"})
		require.Equal(t, id2, cl2.str("id"))
		require.Eventually(t, func() bool {
			return c.do("GET", "/status/"+id2, nil, nil).str("status") == "open"
		}, 15*time.Second, 50*time.Millisecond)
		late := c.do("POST", "/extend_claim/"+id2, nil, map[string]any{"claim_token": cl2.str("claim_token"), "seconds": 60})
		require.Equal(t, http.StatusNotFound, late.status)
		st := c.do("GET", "/status/"+id2, nil, nil)
		require.Equal(t, "Lease expired. Backing off.", st.str("last_error"))
		require.Greater(t, c.do("GET", "/result/"+id2, nil, nil).num("run_at"), float64(time.Now().Unix()+50), "requeued with backoff")
	})

	t.Run("LeaseExpiryOnLastAttemptGoesDead", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "last", "payload": 1, "namespace": ns, "max_attempts": 1})
		require.Equal(t, http.StatusOK, c.claim(ns).status)
		require.Eventually(t, func() bool {
			return c.do("GET", "/status/"+id, nil, nil).str("status") == "dead"
		}, 10*time.Second, 50*time.Millisecond)
		d := b.admin(t, "GET", "/admin/dead/"+id, nil)
		require.Equal(t, http.StatusOK, d.status)
		require.Equal(t, id, d.str("intent_id"))
		require.EqualValues(t, 1, d.num("attempts"))
		// Dead: no backing off is announced.
		require.Equal(t, "Lease expired. No attempts left.", c.do("GET", "/status/"+id, nil, nil).str("last_error"))
		require.Equal(t, "Lease expired. No attempts left.", d.str("reason"))
		require.Equal(t, http.StatusNoContent, c.claim(ns).status)
	})

	t.Run("FailRequeuesWithBackoffThenDead", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "f", "payload": 1, "namespace": ns, "max_attempts": 2, "backoff_base": 1})
		cl := c.claim(ns)
		start := time.Now()
		require.Equal(t, "invalid_request", c.do("POST", "/fail/"+id, nil, map[string]any{"error": "x"}).code())
		r := c.do("POST", "/fail/"+id, nil, map[string]any{"claim_token": cl.str("claim_token"), "error": "boom"})
		require.Equal(t, http.StatusOK, r.status)
		st := c.do("GET", "/status/"+id, nil, nil)
		require.Equal(t, "open", st.str("status"))
		require.Equal(t, "boom", st.str("last_error"))
		// backoff_base·2^1 + [0,2): between 2 and 4 s from the fail.
		wait := st.num("run_at") - float64(start.UnixMilli())/1000
		require.GreaterOrEqual(t, wait, 1.9)
		require.Less(t, wait, 4.5)
		require.Equal(t, http.StatusNoContent, c.claim(ns).status, "not claimable during backoff")
		var cl2 *resp
		require.Eventually(t, func() bool { cl2 = c.claim(ns); return cl2.status == 200 }, 10*time.Second, 100*time.Millisecond)
		r = c.do("POST", "/fail/"+id, nil, map[string]any{"claim_token": cl2.str("claim_token"), "error": "again"})
		require.Equal(t, http.StatusOK, r.status)
		res := c.do("GET", "/result/"+id, nil, nil)
		require.Equal(t, "dead", res.str("status"))
		require.Equal(t, "again", res.str("error"))
		require.Equal(t, "json", res.str("result_type"))
		// The dead letter's reason is the worker's error as given.
		require.Equal(t, "again", b.admin(t, "GET", "/admin/dead/"+id, nil).str("reason"))

		// Admin retry: dead → open with attempts reset; retrying an open
		// intent is refused; cancel sends it to dead.
		rt := b.admin(t, "POST", "/admin/intents/"+id+"/retry", nil)
		require.Equal(t, http.StatusOK, rt.status, string(rt.raw))
		require.Equal(t, "open", rt.str("status"))
		require.EqualValues(t, 0, c.do("GET", "/status/"+id, nil, nil).num("claim_attempts"))
		require.Equal(t, 404, b.admin(t, "GET", "/admin/dead/"+id, nil).status)
		require.Equal(t, http.StatusConflict, b.admin(t, "POST", "/admin/intents/"+id+"/retry", nil).status)
		cn := b.admin(t, "POST", "/admin/intents/"+id+"/cancel", nil)
		require.Equal(t, "dead", cn.str("status"))
		full := b.admin(t, "GET", "/admin/intents/"+id, nil)
		require.Equal(t, "dead", full.str("status"))
		require.EqualValues(t, 1, full.body["payload"])
		require.Equal(t, 404, b.admin(t, "GET", "/admin/intents/"+strings.Repeat("f", 32), nil).status)
	})

	t.Run("PrivateIntentsInvisibleToOtherKeys", func(t *testing.T) {
		t.Parallel()
		alice := b.client(t, b.newKey(t, "alice"))
		bob := b.client(t, b.newKey(t, "bob"))
		ns := uniqueNS(t)
		priv := alice.publishOK(map[string]any{"goal": "p", "payload": 1, "namespace": ns})
		require.Equal(t, http.StatusNoContent, bob.claim(ns).status)
		require.Equal(t, http.StatusForbidden, bob.do("GET", "/status/"+priv, nil, nil).status)
		require.Equal(t, http.StatusForbidden, bob.do("GET", "/result/"+priv, nil, nil).status)
		pub := alice.publishOK(map[string]any{"goal": "p", "payload": 2, "namespace": ns, "visibility": "public"})
		got := bob.claim(ns)
		require.Equal(t, pub, got.str("id"))
		// The claimer may read it; the publisher too; the private one is
		// still alice's alone.
		require.Equal(t, http.StatusOK, bob.do("GET", "/result/"+pub, nil, nil).status)
		require.Equal(t, priv, alice.claim(ns).str("id"))
		// A tester may not filter by another key; the main key may.
		r := bob.claim(ns, [2]string{"publisher", alice.key})
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, "forbidden", r.code())
	})

	t.Run("NamespacesIsolate", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns1, ns2 := uniqueNS(t), uniqueNS(t)
		c.publishOK(map[string]any{"goal": "n", "payload": 1, "namespace": ns1})
		require.Equal(t, http.StatusNoContent, c.claim(ns2).status)
		require.Equal(t, http.StatusOK, c.claim(ns1).status)
		require.Equal(t, "invalid_namespace", c.claim("bad ns!").code())
	})

	t.Run("PriorityAndTieBreakOrder", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		low := c.publishOK(map[string]any{"goal": "o", "payload": 1, "namespace": ns, "priority": 5})
		tie1 := c.publishOK(map[string]any{"goal": "o", "payload": 2, "namespace": ns, "priority": 100})
		high := c.publishOK(map[string]any{"goal": "o", "payload": 3, "namespace": ns, "priority": 999})
		// tie2 must get a later created_at (ms) than tie1.
		t0 := time.Now().UnixMilli()
		require.Eventually(t, func() bool { return time.Now().UnixMilli() > t0+1 }, time.Second, time.Millisecond)
		tie2 := c.publishOK(map[string]any{"goal": "o", "payload": 4, "namespace": ns, "priority": 100})
		var order []string
		for i := 0; i < 4; i++ {
			r := c.claim(ns)
			require.Equal(t, 200, r.status)
			order = append(order, r.str("id"))
		}
		require.Equal(t, []string{high, tie1, tie2, low}, order)
	})

	t.Run("DelayDefersClaim", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "d", "payload": 1, "namespace": ns, "delay": 1.5})
		require.Equal(t, http.StatusNoContent, c.claim(ns).status)
		require.Eventually(t, func() bool { return c.claim(ns).str("id") == id }, 10*time.Second, 100*time.Millisecond)
	})

	t.Run("TargetWorkerAndCapabilities", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		tw := c.publishOK(map[string]any{"goal": "t", "payload": 1, "namespace": ns, "target_worker": "w-1"})
		require.Equal(t, http.StatusNoContent, c.claim(ns).status)
		require.Equal(t, http.StatusNoContent, c.claim(ns, [2]string{"worker_id", "w-2"}).status)
		require.Equal(t, tw, c.do("POST", "/claim", [][2]string{{"namespace", ns}}, nil, "X-Worker-ID", "w-1").str("id"))

		capID := c.publishOK(map[string]any{"goal": "t", "payload": 2, "namespace": ns, "required_capability": "gpu"})
		require.Equal(t, http.StatusNoContent, c.claim(ns, [2]string{"capabilities", "GPU,cpu"}).status, "case-sensitive")
		require.Equal(t, http.StatusNoContent, c.claim(ns, [2]string{"capabilities", "gpux,gp"}).status, "exact tokens")
		require.Equal(t, capID, c.do("POST", "/claim", [][2]string{{"namespace", ns}}, nil, "X-Worker-Capabilities", "cpu, gpu").str("id"))
	})

	t.Run("IdempotentPublish", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		key := "idem-" + nonce()
		r1 := c.do("POST", "/intent", nil, []byte(`{"goal":"i","payload":{"a":1,"b":[1,2]},"namespace":"`+ns+`"}`), "Idempotency-Key", key)
		require.Equal(t, http.StatusCreated, r1.status)
		r2 := c.do("POST", "/intent", nil, []byte(`{ "namespace":"`+ns+`", "payload":{"b":[1,2],"a":1}, "goal":"i" }`), "Idempotency-Key", key)
		require.Equal(t, http.StatusCreated, r2.status)
		require.Equal(t, r1.str("id"), r2.str("id"))
		r3 := c.do("POST", "/intent", nil, []byte(`{"goal":"i","payload":{"a":2},"namespace":"`+ns+`"}`), "Idempotency-Key", key)
		require.Equal(t, http.StatusUnprocessableEntity, r3.status)
		require.Equal(t, "idempotency_conflict", r3.code())
		// Keys are per API key.
		other := b.client(t, b.newKey(t, "idem"))
		r4 := other.do("POST", "/intent", nil, []byte(`{"goal":"i","payload":{"a":2},"namespace":"`+ns+`"}`), "Idempotency-Key", key)
		require.Equal(t, http.StatusCreated, r4.status)
		require.NotEqual(t, r1.str("id"), r4.str("id"))
		require.Equal(t, r1.str("id"), c.claim(ns).str("id"))
		require.Equal(t, http.StatusNoContent, c.claim(ns).status, "the replay made no second intent")
	})

	t.Run("ResultTypes", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "r", "payload": 1, "namespace": ns})
		open := c.do("GET", "/result/"+id, nil, nil)
		require.Equal(t, "json", open.str("result_type"), "never null")
		require.Nil(t, open.body["claim_expires_at"])
		tok := c.claim(ns).str("claim_token")
		bad := c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": tok, "result": 1, "result_type": "xml"})
		require.Equal(t, "invalid_result_type", bad.code())
		bad = c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": tok, "result": 1, "result_type": "text"})
		require.Equal(t, "invalid_result", bad.code())
		bad = c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": tok, "result": strings.Repeat("r", 7200)})
		require.Equal(t, http.StatusRequestEntityTooLarge, bad.status)
		require.Equal(t, "invalid_request", c.do("POST", "/fulfill/"+id, nil, nil).code())
		ok := c.do("POST", "/fulfill/"+id, nil, map[string]any{"claim_token": tok, "result": map[string]any{"sent": true}})
		require.Equal(t, http.StatusOK, ok.status)
		res := c.do("GET", "/result/"+id, nil, nil)
		require.Equal(t, "fulfilled", res.str("status"))
		require.Equal(t, "json", res.str("result_type"))
		require.Equal(t, map[string]any{"sent": true}, res.body["result"])
		require.Greater(t, res.num("completed_at"), 1e9)
		require.Equal(t, 404, c.do("GET", "/result/"+strings.Repeat("a", 32), nil, nil).status)
	})

	t.Run("KVStore", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		other := b.client(t, b.newKey(t, "kv"))
		for _, v := range []any{"hello", map[string]any{"a": 1.5}, []any{true, nil}, 42.0, false} {
			r := c.do("POST", "/set/with space/and slash", nil, map[string]any{"value": v, "ttl": 60})
			require.Equal(t, http.StatusOK, r.status, string(r.raw))
			g := c.do("GET", "/get/with space/and slash", nil, nil)
			require.Equal(t, http.StatusOK, g.status)
			require.Equal(t, v, g.body["value"], "returned as stored")
		}
		require.Equal(t, http.StatusNotFound, other.do("GET", "/get/with space/and slash", nil, nil).status, "scoped per key")
		require.Equal(t, "invalid_request", c.do("POST", "/set/k", nil, map[string]any{"ttl": 5}).code())
		require.Equal(t, "invalid_ttl", c.do("POST", "/set/k", nil, map[string]any{"value": 1, "ttl": 86401}).code())
		require.Equal(t, "invalid_ttl", c.do("POST", "/set/k", nil, map[string]any{"value": 1, "ttl": 0}).code())
		require.Equal(t, http.StatusOK, c.do("POST", "/set/short", nil, map[string]any{"value": 1, "ttl": 1}).status)
		require.Eventually(t, func() bool { return c.do("GET", "/get/short", nil, nil).status == 404 }, 5*time.Second, 100*time.Millisecond)
	})

	t.Run("HMAC", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		// Signed with an encoded query (space, slash, unicode, repeats).
		r := c.do("POST", "/claim", [][2]string{{"namespace", ns}, {"goal", "a b/c é"}, {"capabilities", ""}}, nil)
		require.Equal(t, http.StatusNoContent, r.status)
		bad := c.do("GET", "/health", nil, nil) // not authenticated at all
		require.Equal(t, 200, bad.status)
		for name, h := range map[string][]string{
			"bad signature":    {"X-Signature", strings.Repeat("0", 64)},
			"old timestamp":    {"X-Timestamp", "1000"},
			"non-integer ts":   {"X-Timestamp", "1.5"},
			"missing nonce":    {"X-Nonce", ""},
			"future timestamp": {"X-Timestamp", "99999999999"},
			"body not as sent": {"X-Signature", ""},
		} {
			if name == "body not as sent" {
				continue
			}
			r := c.do("GET", "/status/"+strings.Repeat("a", 32), nil, nil, h...)
			require.Equal(t, http.StatusForbidden, r.status, name)
			require.Equal(t, "invalid_signature", r.code(), name)
		}
		// A replayed nonce is refused.
		req, err := http.NewRequest("GET", b.url()+"/get/x", nil)
		require.NoError(t, err)
		ts := time.Now().Unix()
		n := nonce()
		req.Header.Set("X-API-KEY", mainKey)
		req.Header.Set("X-Timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("X-Nonce", n)
		req.Header.Set("X-Signature", signMsg(mainKey, "GET\n/get/x\n"+strconv.FormatInt(ts, 10)+"\n"+n+"\n"))
		require.Equal(t, http.StatusNotFound, send(t, req).status)
		again := send(t, req.Clone(req.Context()))
		require.Equal(t, http.StatusForbidden, again.status)
		require.Equal(t, "Replay detected", again.message(), "the reference's words")
		// A body changed after signing is refused.
		raw := []byte(`{"goal":"g","payload":1,"namespace":"` + ns + `"}`)
		n = nonce()
		req, err = http.NewRequest("POST", b.url()+"/intent", bytes.NewReader(append(raw, ' ')))
		require.NoError(t, err)
		req.Header.Set("X-API-KEY", mainKey)
		req.Header.Set("X-Timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("X-Nonce", n)
		req.Header.Set("X-Signature", signMsg(mainKey, "POST\n/intent\n"+strconv.FormatInt(ts, 10)+"\n"+n+"\n"+string(raw)))
		require.Equal(t, http.StatusForbidden, send(t, req).status)
	})

	t.Run("AdminAuthOrderNoFallback", func(t *testing.T) {
		t.Parallel()
		get := func(h ...string) *resp {
			req, err := http.NewRequest("GET", b.url()+"/admin/dead", nil)
			require.NoError(t, err)
			for i := 0; i+1 < len(h); i += 2 {
				req.Header.Set(h[i], h[i+1])
			}
			return send(t, req)
		}
		r := get()
		require.Equal(t, 401, r.status)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Basic")
		require.Equal(t, 401, get("X-Admin-Token", mainKey).status, "BUS_SECRET is not an admin token")
		require.Equal(t, 401, get("X-API-KEY", mainKey).status)
		require.Equal(t, 200, get("X-Admin-Token", adminSecret).status)
		req, _ := http.NewRequest("GET", b.url()+"/admin/dashboard", nil)
		req.SetBasicAuth("admin", dashPass)
		d := send(t, req)
		require.Equal(t, 200, d.status)
		require.Contains(t, d.header.Get("Content-Type"), "text/html")
		require.Contains(t, string(d.raw), "Dead letters")
		req, _ = http.NewRequest("GET", b.url()+"/admin/dashboard", nil)
		req.SetBasicAuth("root", dashPass)
		require.Equal(t, 401, send(t, req).status)
	})

	t.Run("KeysRevocable", func(t *testing.T) {
		t.Parallel()
		key := b.newKey(t, "rev")
		c := b.client(t, key)
		require.Equal(t, http.StatusNoContent, c.claim(uniqueNS(t)).status)
		require.Equal(t, "invalid_owner", b.admin(t, "POST", "/admin/generate_key", map[string]any{}).code())
		require.Equal(t, 200, b.admin(t, "POST", "/admin/revoke_key", map[string]any{"api_key": key}).status)
		require.Equal(t, 401, c.claim(uniqueNS(t)).status)
		require.Equal(t, 404, b.admin(t, "POST", "/admin/revoke_key", map[string]any{"api_key": key}).status)
	})

	t.Run("MetricsAuth", func(t *testing.T) {
		t.Parallel()
		req, _ := http.NewRequest("GET", b.url()+"/metrics", nil)
		require.Equal(t, 401, send(t, req).status)
		req.Header.Set("Authorization", "Bearer "+metricsTok)
		r := send(t, req)
		require.Equal(t, 200, r.status)
		require.Contains(t, string(r.raw), "# TYPE intent_bus_intents_total gauge")
		require.Contains(t, string(r.raw), "intent_bus_tester_keys_total")
		m := b.admin(t, "GET", "/metrics", nil)
		require.Equal(t, 200, m.status)
	})

	t.Run("CleanupAndPurge", func(t *testing.T) {
		t.Parallel()
		st := b.admin(t, "POST", "/admin/cleanup", nil)
		require.Equal(t, 200, st.status)
		for _, k := range []string{"expired_open_deleted", "expired_claims_requeued", "expired_claims_dead", "fulfilled_deleted",
			"dead_deleted", "dead_letters_deleted", "store_deleted", "rate_limits_deleted", "idempotency_deleted", "nonces_deleted"} {
			require.Contains(t, st.body, k)
		}
		c := b.client(t, mainKey)
		ns := uniqueNS(t)
		id := c.publishOK(map[string]any{"goal": "pg", "payload": 1, "namespace": ns})
		require.Equal(t, "confirmation_required", b.admin(t, "POST", "/admin/purge", map[string]any{"namespace": ns}).code())
		require.Equal(t, "invalid_namespace", b.admin(t, "POST", "/admin/purge", map[string]any{"confirm": true, "namespace": "a b"}).code())
		require.Equal(t, 200, b.admin(t, "POST", "/admin/purge", map[string]any{"confirm": true, "namespace": ns}).status)
		require.Equal(t, 404, c.do("GET", "/status/"+id, nil, nil).status)
		require.Equal(t, http.StatusNoContent, c.claim(ns).status)
	})
}
