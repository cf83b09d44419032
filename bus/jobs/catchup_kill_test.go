package jobs_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestSIGKILLRightAfterAFailKeepsTheJobAndItsSignedNonce: a signed fail
// and a publish answered just before a SIGKILL — with no read in between,
// so the log's projections (beam_jobs among them) are still behind the
// events — come back after the restart from the catch-up: the failed job
// is open with its attempt counted, its error, and its backoff (not
// claimable before it), the published job exists, and the signed fail
// cannot be replayed into the new process.
func TestSIGKILLRightAfterAFailKeepsTheJobAndItsSignedNonce(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Env: baseEnv("BEAM_INTENT_CLAIM_TIMEOUT=30s")})
	b := &bus{p: p}
	c := b.client(t, mainKey)
	ns := uniqueNS(t)
	id := c.publishOK(map[string]any{"goal": "g", "payload": 1, "namespace": ns, "backoff_base": 3600, "max_attempts": 3})
	cl := c.claim(ns)
	require.Equal(t, http.StatusOK, cl.status, string(cl.raw))
	require.Equal(t, id, cl.str("id"))
	failBody := []byte(`{"claim_token":"` + cl.str("claim_token") + `","error":"boom"}`)
	fail := signedReq(t, "POST", b.url()+"/fail/"+id, failBody, time.Now().Unix())
	r := send(t, cloneWithBody(fail, failBody))
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	late := c.publishOK(map[string]any{"goal": "late", "payload": 2, "namespace": ns + "-late"})
	p.Restart() // SIGKILL at once, then start on the same data directory

	require.Contains(t, p.Output(), "folded the events written after the projections", "the kill came after the projections were written: the catch-up is not exercised")
	v := b.admin(t, "GET", "/admin/intents/"+id, nil)
	require.Equal(t, http.StatusOK, v.status, string(v.raw))
	require.Equal(t, "open", v.str("status"), string(v.raw))
	require.EqualValues(t, 1, v.num("claim_attempts"), string(v.raw))
	require.Contains(t, string(v.raw), "boom")
	again := c.claim(ns)
	require.NotEqual(t, http.StatusOK, again.status, "the failed job was claimable before its backoff: %s", again.raw)
	require.Equal(t, http.StatusOK, b.admin(t, "GET", "/admin/intents/"+late, nil).status, "a job published just before the kill was lost")

	fail.URL.Host = strings.TrimPrefix(b.url(), "http://")
	rr := send(t, cloneWithBody(fail.Clone(context.Background()), failBody))
	require.Equal(t, http.StatusForbidden, rr.status, string(rr.raw))
	require.Equal(t, "Replay detected", rr.message())
}
