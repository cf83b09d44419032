package jobs

import (
	"github.com/beamdir/beam/tracing"
)

// Op is a protocol operation that changes a job's status.
type Op string

// The operations of the job lifecycle.
const (
	OpPublish Op = "publish"
	OpClaim   Op = "claim"
	OpExtend  Op = "extend"
	OpFulfill Op = "fulfill"
	OpFail    Op = "fail"
	OpExpire  Op = "expire"
	OpCancel  Op = "cancel"
	OpRetry   Op = "retry"
	OpPurge   Op = "purge"
)

// lifecycle is the job lifecycle of RFC §3.2 as data: job statuses moved
// by protocol operations. A fail or an expiry goes to open while attempts
// remain and to dead when they are exhausted; an admin cancel reaches dead
// from open or claimed (a fulfilled job keeps its result); only a dead job
// may be retried; a purge may remove a job in any status. The log's writer
// checks every job event against it (jobStep), the service before it
// appends (allowed).
var lifecycle = tracing.Register(&tracing.Lifecycle{
	Name:    "job",
	Owner:   tracing.OwnerJobs,
	Package: "bus/jobs",
	Doc: "An Intent Protocol job (RFC §3.2). Its status is the canonical state of its nonce mapped by " +
		"`tracing.JobStatusOf`; the operation is `details.job.op`.",
	States:   []string{tracing.JobOpen, tracing.JobClaimed, tracing.JobFulfilled, tracing.JobDead},
	Terminal: []string{tracing.JobFulfilled, tracing.JobDead},
	Transitions: []tracing.Transition{
		{From: "", To: tracing.JobOpen, On: string(OpPublish)},
		{From: tracing.JobOpen, To: tracing.JobClaimed, On: string(OpClaim)},
		{From: tracing.JobClaimed, To: tracing.JobClaimed, On: string(OpExtend)},
		{From: tracing.JobClaimed, To: tracing.JobFulfilled, On: string(OpFulfill)},
		{From: tracing.JobClaimed, To: tracing.JobOpen, On: string(OpFail)},
		{From: tracing.JobClaimed, To: tracing.JobDead, On: string(OpFail)},
		{From: tracing.JobClaimed, To: tracing.JobOpen, On: string(OpExpire)},
		{From: tracing.JobClaimed, To: tracing.JobDead, On: string(OpExpire)},
		{From: tracing.JobDead, To: tracing.JobOpen, On: string(OpRetry)},
		{From: tracing.JobOpen, To: tracing.JobDead, On: string(OpCancel)},
		{From: tracing.JobClaimed, To: tracing.JobDead, On: string(OpCancel)},
		{From: tracing.JobOpen, To: tracing.JobDead, On: string(OpPurge)},
		{From: tracing.JobClaimed, To: tracing.JobDead, On: string(OpPurge)},
	},
	Step:       jobStep,
	Projection: projection,
})

// jobStep maps a job event to its transition: the statuses of the
// canonical states before and after it, by details.job.op. The later
// events of one operation (publish's queued, claim's delivered) keep the
// status and make no transition of their own; an extend does.
func jobStep(cur tracing.State, ev *tracing.Event) (from, to, on string, ok bool) {
	j := ev.Details.Job
	if j == nil {
		return "", "", "", false
	}
	if cur != "" {
		from = tracing.JobStatusOf(cur)
	}
	to = tracing.JobStatusOf(ev.State)
	if from == to && j.Op != string(OpExtend) {
		return "", "", "", false
	}
	return from, to, j.Op, true
}

// allowed reports whether op may move a job from status from to status to.
func allowed(from, to string, op Op) bool {
	return lifecycle.Allows(from, to, string(op))
}

// canonical are the log states each operation appends, in order.
var canonical = map[Op][]tracing.State{
	OpPublish: {tracing.Received, tracing.Queued},
	OpClaim:   {tracing.Dispatched, tracing.Delivered},
	OpExtend:  {tracing.Delivered},
	OpFulfill: {tracing.Acked},
	OpRetry:   {tracing.Queued},
}

// statesFor returns the log states of op moving a job to status to.
func statesFor(op Op, to string) []tracing.State {
	if s, ok := canonical[op]; ok {
		return s
	}
	if to == tracing.JobOpen {
		return []tracing.State{tracing.Queued}
	}
	return []tracing.State{tracing.DeadLetter}
}
