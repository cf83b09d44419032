package jobs

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

func randomJobRow(rng *rand.Rand) *jobRow {
	str := func() string {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	raw := func() []byte {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return []byte{}
		}
		return []byte(`{"n":` + str() + `}`)
	}
	num := func() int64 { return rng.Int64N(1<<40) - 1<<39 }
	r := &jobRow{row: tracing.JobRow{ID: str(), Nonce: str(), Namespace: str(), Goal: str(), Payload: raw(),
		Status: str(), State: tracing.State(str()), Priority: int(num()), Visibility: str(), TargetWorker: str(),
		RequiredCapability: str(), Publisher: str(), ClaimedBy: str(), TokenHash: str(), ClaimAttempts: int(num()),
		MaxAttempts: int(num()), BackoffBase: rng.Float64() * 10, CreatedAt: num(), ExpiresAt: num(), RunAt: num(),
		ClaimedAt: num(), ClaimExpiresAt: num(), LastError: str(), FailedAt: num(), Result: raw(), ResultType: str(),
		CompletedAt: num(), DeadReason: str(), DeadAt: num(), Purged: rng.IntN(2) == 0, UpdatedAt: num(),
		FirstSeq: num(), LastSeq: num()}}
	for range rng.IntN(4) {
		r.signed = append(r.signed, signedUse{Key: str(), At: num()})
	}
	return r
}

// TestJobRowStoredForm: a job row survives its stored form exactly (nil
// and empty raw JSON kept apart, the token hash included), and a truncated
// one is an error, never a panic.
func TestJobRowStoredForm(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(lifecycletest.Seed(t), 7))
	for range 500 {
		r := randomJobRow(rng)
		b, err := r.MarshalBinary()
		require.NoError(t, err)
		var got jobRow
		require.NoError(t, got.UnmarshalBinary(b))
		require.Equal(t, *r, got)
		for cut := range len(b) {
			var short jobRow
			require.Error(t, short.UnmarshalBinary(b[:cut]))
		}
	}
}

// TestJobRowKeepsRecentSignedNonces: the row keeps the signed nonces of
// the job's requests for twice the signature window after their event.
func TestJobRowKeepsRecentSignedNonces(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := func(at time.Time, state tracing.State, op Op, signed string) tracing.Event {
		return tracing.Event{Nonce: noncePrefix + "x", State: state, At: at,
			Details: tracing.Details{Job: &tracing.JobDetails{Op: string(op), ID: "x", SignedNonce: signed}}}
	}
	var r jobRow
	r.Apply(ev(t0, tracing.Received, OpPublish, "d:1"))
	r.Apply(ev(t0.Add(time.Second), tracing.Dispatched, OpClaim, "d:2"))
	require.Equal(t, []signedUse{{"d:1", t0.UnixMilli()}, {"d:2", t0.Add(time.Second).UnixMilli()}}, r.signed)
	late := t0.Add(2*signatureWindow + 500*time.Millisecond)
	r.Apply(ev(late, tracing.Delivered, OpExtend, "d:3"))
	require.Equal(t, []signedUse{{"d:2", t0.Add(time.Second).UnixMilli()}, {"d:3", late.UnixMilli()}}, r.signed)
	require.Equal(t, "x", r.row.ID)
}

func FuzzJobRowDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		b, _ := randomJobRow(rng).MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{rowFormat})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r jobRow
		if r.UnmarshalBinary(b) != nil {
			return
		}
		again, err := r.MarshalBinary()
		require.NoError(t, err)
		var r2 jobRow
		require.NoError(t, r2.UnmarshalBinary(again))
		require.Equal(t, r, r2)
	})
}
