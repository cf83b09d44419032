package jobs_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

// jobOps are the operations a walk picks from, with the canonical states
// each may append (the walk also tries them on jobs in the wrong status).
var jobOps = []struct {
	op     jobs.Op
	states []tracing.State
}{
	{jobs.OpPublish, []tracing.State{tracing.Received, tracing.Queued}},
	{jobs.OpClaim, []tracing.State{tracing.Dispatched, tracing.Delivered}},
	{jobs.OpExtend, []tracing.State{tracing.Delivered}},
	{jobs.OpFulfill, []tracing.State{tracing.Acked}},
	{jobs.OpFail, []tracing.State{tracing.Queued, tracing.DeadLetter}},
	{jobs.OpExpire, []tracing.State{tracing.Queued, tracing.DeadLetter}},
	{jobs.OpCancel, []tracing.State{tracing.DeadLetter}},
	{jobs.OpRetry, []tracing.State{tracing.Queued}},
	{jobs.OpPurge, []tracing.State{tracing.DeadLetter}},
	// A takeover's marker of an adopted job (Service.Adopt) keeps its
	// status.
	{"takeover", []tracing.State{tracing.Queued, tracing.Delivered}},
}

// TestJobLifecycleWalk: random job operations, appended through the log,
// leave only transitions of the job table (jobs.Lifecycle) in the log: the
// writer refuses the others. A rebuild and a reopen give the rows the
// appender wrote, beam_jobs included, and the job bus starts from them.
func TestJobLifecycleWalk(t *testing.T) {
	t.Parallel()
	lg, reopen := lifecycletest.OpenLog(t)
	seed := lifecycletest.Seed(t)
	attempts := 0
	lg, _ = lifecycletest.Walk(t, lg, tracing.OwnerJobs, "job:walk-", seed, 800, 30,
		func(rng *rand.Rand, nonce string, cur tracing.State) tracing.Event {
			o := jobOps[rng.IntN(len(jobOps))]
			if cur == "" && rng.IntN(3) > 0 {
				o = jobOps[0]
			}
			attempts++
			ev := tracing.Event{Nonce: nonce, State: o.states[rng.IntN(len(o.states))], Transport: "http",
				Details: tracing.Details{Job: &tracing.JobDetails{Op: string(o.op), Attempts: &attempts}}}
			if cur == "" {
				ev.From, ev.To, ev.IntentType = "publisher", "worker", "job"
				ev.Details.Owner = tracing.OwnerJobs
				ev.Details.Job.ID = nonce[len("job:"):]
				ev.Details.Job.Namespace = "walk"
				ev.Details.Job.Goal = "g"
			}
			return ev
		}, reopen)

	// The job bus starts from the projection: the jobs it counts are those
	// a fold of the log gives.
	ctx := context.Background()
	want := map[string]map[string]int{}
	err := lg.EachIntent(ctx, tracing.IntentQuery{}, func(r *tracing.IntentRow) error {
		evs, err := lg.Trace(ctx, r.Nonce)
		if err != nil {
			return err
		}
		var row tracing.JobRow
		for _, ev := range evs {
			if ev.Details.Job != nil && (row.ID != "" || ev.State == tracing.Received) {
				row.Apply(ev)
			}
		}
		if row.ID != "" && !row.Purged {
			if want[row.Namespace] == nil {
				want[row.Namespace] = map[string]int{}
			}
			want[row.Namespace][row.Status]++
		}
		return nil
	})
	require.NoError(t, err)
	s, err := jobs.Open(ctx, jobs.Config{Log: lg, Secret: "walk-secret-0123456789abcdef"})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, want, s.Counts())
}
