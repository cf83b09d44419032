package jobs

import (
	"slices"

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

// transition is one row of the job transition table.
type transition struct {
	from, to string // job statuses; from "" is a new job
	op       Op
}

// transitions is the lifecycle of RFC §3.2 as data. A fail or an expiry
// goes to open while attempts remain and to dead when they are exhausted;
// an admin cancel reaches dead from open or claimed (a fulfilled job keeps
// its result); only a dead job may be retried; a purge may remove a job in
// any status.
var transitions = []transition{
	{"", tracing.JobOpen, OpPublish},
	{tracing.JobOpen, tracing.JobClaimed, OpClaim},
	{tracing.JobClaimed, tracing.JobClaimed, OpExtend},
	{tracing.JobClaimed, tracing.JobFulfilled, OpFulfill},
	{tracing.JobClaimed, tracing.JobOpen, OpFail},
	{tracing.JobClaimed, tracing.JobDead, OpFail},
	{tracing.JobClaimed, tracing.JobOpen, OpExpire},
	{tracing.JobClaimed, tracing.JobDead, OpExpire},
	{tracing.JobDead, tracing.JobOpen, OpRetry},
	{tracing.JobOpen, tracing.JobDead, OpCancel},
	{tracing.JobClaimed, tracing.JobDead, OpCancel},
	{tracing.JobOpen, tracing.JobDead, OpPurge},
	{tracing.JobClaimed, tracing.JobDead, OpPurge},
}

// allowed reports whether op may move a job from status from to status to.
func allowed(from, to string, op Op) bool {
	return slices.Contains(transitions, transition{from, to, op})
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
