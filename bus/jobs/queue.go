package jobs

import (
	"container/heap"
	"strings"

	"github.com/beamdir/beam/tracing"
)

// job is the in-memory state of one job: its folded row plus its places in
// the claim index.
type job struct {
	row tracing.JobRow
	// busy is set while an append for the job is in flight; no other
	// operation may start on it until the append's outcome is applied.
	busy bool
	grp  *group
	// ridx is the job's index in its ready heap (-1: not in it).
	ridx int
}

func newJob(row tracing.JobRow) *job { return &job{row: row, ridx: -1} }

// groupKey is what decides which workers may claim a job besides its
// namespace: jobs with the same key are eligible for the same claims.
type groupKey struct {
	goal, target, capability, publisher string
	public                              bool
}

func keyOf(r *tracing.JobRow) groupKey {
	return groupKey{goal: r.Goal, target: r.TargetWorker, capability: r.RequiredCapability,
		publisher: r.Publisher, public: r.Visibility == "public"}
}

// claimFilter is what a claim asks for.
type claimFilter struct {
	namespace string
	goal      string // "" any
	publisher string // key digest, "" any visible
	caller    string // caller's key digest
	worker    string
	caps      []string
}

// eligible reports whether jobs of group k may be claimed by f (all but
// run_at and expires_at, which are per job).
func (k groupKey) eligible(f *claimFilter) bool {
	if f.goal != "" && k.goal != f.goal {
		return false
	}
	if f.publisher != "" {
		if k.publisher != f.publisher || (!k.public && k.publisher != f.caller) {
			return false
		}
	} else if !k.public && k.publisher != f.caller {
		return false
	}
	if k.target != "" && k.target != f.worker {
		return false
	}
	if k.capability != "" {
		for _, c := range f.caps {
			if c == k.capability {
				return true
			}
		}
		return false
	}
	return true
}

// splitCaps splits a comma-separated capability list into exact tokens
// (surrounding spaces trimmed, empty tokens dropped).
func splitCaps(s string) []string {
	if s == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	out := parts[:0]
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// before is the claim order of RFC §6.3: priority descending, then run_at,
// claim_attempts, created_at and id ascending.
func before(a, b *job) bool {
	x, y := &a.row, &b.row
	if x.Priority != y.Priority {
		return x.Priority > y.Priority
	}
	if x.RunAt != y.RunAt {
		return x.RunAt < y.RunAt
	}
	if x.ClaimAttempts != y.ClaimAttempts {
		return x.ClaimAttempts < y.ClaimAttempts
	}
	if x.CreatedAt != y.CreatedAt {
		return x.CreatedAt < y.CreatedAt
	}
	return x.ID < y.ID
}

// jheap is a heap of jobs that keeps each job's index in it.
type jheap struct {
	items []*job
	less  func(a, b *job) bool
	idx   func(j *job) *int
}

func (h *jheap) Len() int           { return len(h.items) }
func (h *jheap) Less(i, k int) bool { return h.less(h.items[i], h.items[k]) }
func (h *jheap) Swap(i, k int) {
	h.items[i], h.items[k] = h.items[k], h.items[i]
	*h.idx(h.items[i]) = i
	*h.idx(h.items[k]) = k
}
func (h *jheap) Push(x any) {
	j := x.(*job)
	*h.idx(j) = len(h.items)
	h.items = append(h.items, j)
}
func (h *jheap) Pop() any {
	n := len(h.items) - 1
	j := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	*h.idx(j) = -1
	return j
}

func (h *jheap) add(j *job) { heap.Push(h, j) }

func (h *jheap) remove(j *job) {
	if i := *h.idx(j); i >= 0 && i < len(h.items) && h.items[i] == j {
		heap.Remove(h, i)
	}
}

func (h *jheap) top() *job {
	if len(h.items) == 0 {
		return nil
	}
	return h.items[0]
}

// group is the ready heap of one namespace and group key.
type group struct {
	key groupKey
	h   jheap
}

func newReadyHeap() jheap {
	return jheap{less: before, idx: func(j *job) *int { return &j.ridx }}
}
