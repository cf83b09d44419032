package jobs

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// TestBackoffIsBaseTimesTwoToTheAttemptsPlusUpToTwoSeconds: the requeue
// delay of RFC §3.3, backoff_base·2^claim_attempts capped at the intent TTL,
// plus a random [0, 2) s.
func TestBackoffIsBaseTimesTwoToTheAttemptsPlusUpToTwoSeconds(t *testing.T) {
	t.Parallel()
	with := func(fill byte) *Service {
		return &Service{rand: bytes.NewReader(bytes.Repeat([]byte{fill}, 8))}
	}
	cases := []struct {
		base     float64
		attempts int
		want     time.Duration
	}{
		{1, 0, time.Second},
		{1, 1, 2 * time.Second},
		{5, 3, 40 * time.Second},
		{1.5, 2, 6 * time.Second},
		{3600, 10, intentTTL}, // capped before the spread
	}
	for _, c := range cases {
		r := &tracing.JobRow{BackoffBase: c.base, ClaimAttempts: c.attempts}
		require.Equal(t, c.want, with(0).backoff(r), "base %v attempts %d, least draw", c.base, c.attempts)
		hi := with(0xff).backoff(r)
		require.Greater(t, hi, c.want+1999*time.Millisecond, "base %v attempts %d, greatest draw", c.base, c.attempts)
		require.Less(t, hi, c.want+2*time.Second, "base %v attempts %d, greatest draw", c.base, c.attempts)
	}
	// A failing random source still backs off: the middle of the spread.
	require.Equal(t, 3*time.Second, (&Service{rand: bytes.NewReader(nil)}).backoff(&tracing.JobRow{BackoffBase: 1, ClaimAttempts: 1}))
}
