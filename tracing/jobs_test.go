package tracing

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func jobEvents(nonce string) [][]Event {
	prio, one, two, zero := 7, 1, 2, 0
	jd := func(d JobDetails) Details { return Details{Job: &d} }
	pub := Event{Nonce: nonce, State: Received, From: "intent:pub", To: "intent:ns", IntentType: "goal", Transport: "intent",
		Details: Details{Owner: OwnerJobs, Job: &JobDetails{Op: "publish", ID: nonce[4:], Namespace: "ns", Goal: "goal<&>",
			Payload: json.RawMessage(`{"b":[1,2.50],"a":"é<&>"}`), Priority: &prio, Visibility: "public", TargetWorker: "w:1",
			RequiredCapability: "gpu", MaxAttempts: 2, BackoffBase: 1.5, Publisher: "pub", ExpiresAt: 99, RunAt: 10}}}
	return [][]Event{
		{pub, {Nonce: nonce, State: Queued, Details: jd(JobDetails{Op: "queue", RunAt: 10})}},
		{{Nonce: nonce, State: Dispatched, Attempt: 1, Details: jd(JobDetails{Op: "claim", ClaimedBy: "w", TokenHash: "h1", LeaseExpiresAt: 50, Attempts: &one})},
			{Nonce: nonce, State: Delivered, Details: jd(JobDetails{Op: "accept"})}},
		{{Nonce: nonce, State: Delivered, Details: jd(JobDetails{Op: "extend", LeaseExpiresAt: 70})}},
		{{Nonce: nonce, State: Queued, Details: jd(JobDetails{Op: "expire", Error: "Lease expired", RunAt: 80})}},
		{{Nonce: nonce, State: Dispatched, Attempt: 2, Details: jd(JobDetails{Op: "claim", ClaimedBy: "w2", TokenHash: "h2", LeaseExpiresAt: 90, Attempts: &two})},
			{Nonce: nonce, State: Delivered, Details: jd(JobDetails{Op: "accept"})}},
		{{Nonce: nonce, State: DeadLetter, Details: jd(JobDetails{Op: "fail", Error: "boom", Reason: "Max attempts reached: boom"})}},
		{{Nonce: nonce, State: Queued, Details: jd(JobDetails{Op: "retry", Attempts: &zero, RunAt: 100, Error: "Retried by admin"})}},
		{{Nonce: nonce, State: Dispatched, Attempt: 1, Details: jd(JobDetails{Op: "claim", ClaimedBy: "w3", TokenHash: "h3", LeaseExpiresAt: 120, Attempts: &one})},
			{Nonce: nonce, State: Delivered, Details: jd(JobDetails{Op: "accept"})}},
		{{Nonce: nonce, State: Acked, Details: jd(JobDetails{Op: "fulfill", Result: json.RawMessage(` {"ok" : true} `), ResultType: "json"})}},
	}
}

// TestJobFoldEqualsRefold: the job row folded from the events as appended
// equals the row folded from the events read back from the log (through
// both the fold decoder and encoding/json), after a reopen and after a
// rebuild.
func TestJobFoldEqualsRefold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	nonce := "job:0123456789abcdef0123456789abcdef"
	var live JobRow
	for _, call := range jobEvents(nonce) {
		done := b.append(call...)
		for _, e := range done {
			live.Apply(e)
		}
	}
	require.Equal(t, JobFulfilled, live.Status)
	require.Equal(t, 1, live.ClaimAttempts)
	require.Equal(t, "w3", live.ClaimedBy)
	require.Empty(t, live.TokenHash)
	require.Equal(t, "Retried by admin", live.LastError)
	require.JSONEq(t, `{"ok":true}`, string(live.Result))
	require.Equal(t, `{"b":[1,2.50],"a":"é<&>"}`, string(live.Payload), "payload bytes kept")
	require.Equal(t, 7, live.Priority)

	refold := func() JobRow {
		evs, err := b.log.Trace(ctx, nonce)
		require.NoError(t, err)
		var r JobRow
		for _, e := range evs {
			r.Apply(e)
		}
		var all JobRow
		es, err := b.log.Events(ctx, 0, 0)
		require.NoError(t, err)
		for _, e := range es {
			all.Apply(e)
		}
		require.Equal(t, r, all)
		return r
	}
	require.Equal(t, live, refold())
	b.reopen()
	require.Equal(t, live, refold())
	_, err := b.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, live, refold())
	row, ok, err := b.log.Intent(ctx, nonce)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, OwnerJobs, row.Owner)
	require.Equal(t, Acked, row.Status)

	// Every decode path reads details.job the same way.
	for _, raw := range []string{
		`{"owner":"jobs","job":{"op":"claim","claimedBy":"w","tokenHash":"h","leaseExpiresAt":5,"attempts":1}}`,
		`{"job":{"op":"claim","attempts":1,"claimedBy":"w","tokenHash":"h","leaseExpiresAt":5},"owner":"jobs"}`,
	} {
		var fast, slow Details
		require.NoError(t, fast.decodeFold([]byte(raw)))
		require.NoError(t, slow.decodeKnown([]byte(raw)))
		require.Equal(t, slow.Job, fast.Job)
		require.Equal(t, OwnerJobs, fast.Owner)
		require.Equal(t, 1, *fast.Job.Attempts)
	}
}
