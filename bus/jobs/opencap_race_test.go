package jobs_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenCapHoldsWhileClaimsRace publishes as a tester key with an open
// cap of 5 from eight goroutines while eight others claim its jobs: a job
// being claimed is still open or claimed, so at no time may a publish slip
// in beside it. Leases do not expire during the test and nothing is
// settled, so every accepted publish is still open or claimed at the end:
// at most 5 may be accepted.
func TestOpenCapHoldsWhileClaimsRace(t *testing.T) {
	t.Parallel()
	const openCap = 5
	b := startBus(t, "BEAM_INTENT_OPEN_CAP=5", "BEAM_INTENT_RATE_LIMIT=100000", "BEAM_INTENT_CLAIM_TIMEOUT=1h")
	key := b.newKey(t, "racer")
	ns := uniqueNS(t)

	var published, claimed, failed atomic.Int64
	// tally counts an answer of status hit in hits; any answer but hit or
	// miss, or none, is a failure.
	tally := func(r *resp, ok bool, hit int, hits *atomic.Int64, miss int) {
		switch {
		case !ok || r.status != hit && r.status != miss:
			failed.Add(1)
		case r.status == hit:
			hits.Add(1)
		}
	}
	var publishers, claimers sync.WaitGroup
	done := make(chan struct{})
	for range 8 {
		publishers.Add(1)
		go func() {
			defer publishers.Done()
			c := b.client(nopT{t}, key)
			for range 40 {
				r, ok := c.try("POST", "/intent", nil, map[string]any{"goal": "race", "payload": 1, "namespace": ns})
				tally(r, ok, http.StatusCreated, &published, http.StatusTooManyRequests)
			}
		}()
		claimers.Add(1)
		go func() {
			defer claimers.Done()
			c := b.client(nopT{t}, key) // private jobs: only their publisher claims them
			for {
				select {
				case <-done:
					return
				default:
				}
				r, ok := c.try("POST", "/claim", [][2]string{{"namespace", ns}}, nil)
				tally(r, ok, http.StatusOK, &claimed, http.StatusNoContent)
			}
		}()
	}
	publishers.Wait()
	close(done)
	claimers.Wait()
	require.Zero(t, failed.Load(), "every request was answered 201/429 or 200/204")
	require.Positive(t, claimed.Load(), "claims ran alongside the publishes")
	require.LessOrEqual(t, published.Load(), int64(openCap), "accepted publishes, all still open or claimed")
}
