package jobs_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStrictModes: BUS_REQUIRE_SIGNATURES, the tester rate limit and open
// cap (set low here), and BUS_ENFORCE_HTTPS behind a trusted proxy.
func TestStrictModes(t *testing.T) {
	t.Parallel()
	b := startBus(t, "BUS_REQUIRE_SIGNATURES=true", "BEAM_INTENT_RATE_LIMIT=6", "BEAM_INTENT_OPEN_CAP=3",
		"BUS_ENFORCE_HTTPS=true", "BUS_TRUST_PROXY=true")

	t.Run("UnsignedRefused", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		c.sign = false
		r := c.claim(uniqueNS(t))
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, "invalid_signature", r.code())
		c.sign = true
		require.Equal(t, http.StatusNoContent, c.claim(uniqueNS(t)).status)
	})

	t.Run("OpenCapThenRateLimit", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, b.newKey(t, "capped"))
		ns := uniqueNS(t)
		for i := 0; i < 3; i++ {
			c.publishOK(map[string]any{"goal": "c", "payload": i, "namespace": ns})
		}
		r := c.publish(map[string]any{"goal": "c", "payload": 9, "namespace": ns})
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "limit_exceeded", r.code())
		require.NotEmpty(t, r.header.Get("Retry-After"))
		// The main key is exempt from both.
		m := b.client(t, mainKey)
		for i := 0; i < 8; i++ {
			m.publishOK(map[string]any{"goal": "c", "payload": i, "namespace": ns})
		}
		// Requests 5 and 6 of the window pass, the 7th is limited.
		require.Equal(t, http.StatusOK, c.claim(ns).status)
		require.Equal(t, http.StatusOK, c.claim(ns).status)
		r = c.claim(ns)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "rate_limited", r.code())
		ra, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err)
		require.True(t, ra >= 1 && ra <= 60, ra)
	})

	t.Run("HTTPSRequiredBehindProxy", func(t *testing.T) {
		t.Parallel()
		c := b.client(t, mainKey)
		r := c.do("POST", "/claim", [][2]string{{"namespace", "default"}}, nil, "X-Forwarded-For", "203.0.113.7")
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, "https_required", r.code())
		r = c.do("POST", "/claim", [][2]string{{"namespace", "default"}}, nil, "X-Forwarded-For", "203.0.113.7", "X-Forwarded-Proto", "https")
		require.Equal(t, http.StatusNoContent, r.status)
	})
}

// TestMaintenanceMode: client routes answer 503 maintenance; admin routes,
// /health and /metrics still work.
func TestMaintenanceMode(t *testing.T) {
	t.Parallel()
	b := startBus(t, "BUS_MAINTENANCE_MODE=true")
	c := b.client(t, mainKey)
	r := c.publish(map[string]any{"goal": "m", "payload": 1})
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "maintenance", r.code())
	require.Equal(t, http.StatusOK, b.admin(t, "GET", "/admin/dead", nil).status)
	require.Equal(t, http.StatusOK, b.admin(t, "GET", "/metrics", nil).status)
	require.Equal(t, http.StatusOK, (&client{t: t, base: b.url}).do("GET", "/health", nil, nil).status)
}

// TestPurgeAll: a purge without a namespace removes every intent, dead
// letter, KV entry and idempotency record, and survives a restart.
func TestPurgeAll(t *testing.T) {
	t.Parallel()
	b := startBus(t)
	c := b.client(t, mainKey)
	ns := uniqueNS(t)
	open := c.publishOK(map[string]any{"goal": "p", "payload": 1, "namespace": ns})
	dead := c.publishOK(map[string]any{"goal": "q", "payload": 2, "namespace": ns, "max_attempts": 1})
	cl := c.claim(ns, [2]string{"goal", "q"})
	require.Equal(t, 200, c.do("POST", "/fail/"+dead, nil, map[string]any{"claim_token": cl.str("claim_token")}).status)
	require.Equal(t, 200, c.do("POST", "/set/k", nil, map[string]any{"value": "v"}).status)
	idem := c.do("POST", "/intent", nil, []byte(`{"goal":"i","payload":1,"namespace":"`+ns+`"}`), "Idempotency-Key", "same")
	require.Equal(t, 201, idem.status)

	require.Equal(t, 200, b.admin(t, "POST", "/admin/purge", map[string]any{"confirm": true}).status)
	check := func() {
		for _, id := range []string{open, dead, idem.str("id")} {
			require.Equal(t, 404, c.do("GET", "/status/"+id, nil, nil).status, id)
		}
		require.Equal(t, 404, b.admin(t, "GET", "/admin/dead/"+dead, nil).status)
		require.Equal(t, 404, c.do("GET", "/get/k", nil, nil).status)
		require.Equal(t, http.StatusNoContent, c.claim(ns).status)
	}
	check()
	// The idempotency record went too: the same key makes a new intent.
	again := c.do("POST", "/intent", nil, []byte(`{"goal":"i","payload":1,"namespace":"`+ns+`"}`), "Idempotency-Key", "same")
	require.Equal(t, 201, again.status)
	require.NotEqual(t, idem.str("id"), again.str("id"))
	require.Equal(t, 200, b.admin(t, "POST", "/admin/purge", map[string]any{"confirm": true}).status)
	b.p.Restart()
	check()
	require.Equal(t, 404, c.do("GET", "/status/"+again.str("id"), nil, nil).status)
}
