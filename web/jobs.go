package web

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// jobsView is what the dashboard reads and does on the Intent Protocol job bus
// (implemented by bus/jobs.Service).
type jobsView interface {
	// Counts returns jobs by namespace and status.
	Counts() map[string]map[string]int
	// Recent returns up to n jobs, newest first (only dead ones if
	// deadOnly).
	Recent(n int, deadOnly bool) []tracing.JobRow
	// Retry moves a dead job back to open; Cancel sends one to dead.
	Retry(ctx context.Context, id string) (string, error)
	Cancel(ctx context.Context, id string) (string, error)
}

// SetJobs makes the job bus's queues visible on the dashboard (it starts
// after the dashboard is built).
func (d *Dashboard) SetJobs(j jobsView) {
	d.jobsMu.Lock()
	d.jobsSrc = j
	d.jobsMu.Unlock()
}

func (d *Dashboard) jobs() jobsView {
	d.jobsMu.Lock()
	defer d.jobsMu.Unlock()
	return d.jobsSrc
}

type jobQueue struct {
	Namespace string `json:"namespace"`
	Open      int    `json:"open"`
	Claimed   int    `json:"claimed"`
	Fulfilled int    `json:"fulfilled"`
	Dead      int    `json:"dead"`
}

type jobView struct {
	ID            string  `json:"id"`
	Nonce         string  `json:"nonce"`
	Namespace     string  `json:"namespace"`
	Goal          string  `json:"goal"`
	Status        string  `json:"status"`
	Priority      int     `json:"priority"`
	ClaimAttempts int     `json:"claimAttempts"`
	MaxAttempts   int     `json:"maxAttempts"`
	LastError     string  `json:"lastError,omitempty"`
	Reason        string  `json:"reason,omitempty"`
	CreatedAt     *string `json:"createdAt"`
	UpdatedAt     *string `json:"updatedAt"`
}

func isoMs(ms int64) *string {
	if ms == 0 {
		return nil
	}
	s := time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
	return &s
}

func jobViewOf(r *tracing.JobRow) jobView {
	return jobView{ID: r.ID, Nonce: r.Nonce, Namespace: r.Namespace, Goal: r.Goal, Status: r.Status, Priority: r.Priority,
		ClaimAttempts: r.ClaimAttempts, MaxAttempts: r.MaxAttempts, LastError: r.LastError, Reason: r.DeadReason,
		CreatedAt: isoMs(r.CreatedAt), UpdatedAt: isoMs(r.UpdatedAt)}
}

// handleJobs answers GET /observability/jobs: queue counts by namespace and
// status, recent jobs and dead letters.
func (d *Dashboard) handleJobs(w http.ResponseWriter, r *http.Request, p principal) error {
	j := d.jobs()
	if j == nil {
		httpjson.Write(w, http.StatusOK, map[string]any{"enabled": false, "queues": []jobQueue{}, "recent": []jobView{}, "dead": []jobView{}})
		return nil
	}
	var qs []jobQueue
	for ns, m := range j.Counts() {
		qs = append(qs, jobQueue{Namespace: ns, Open: m[tracing.JobOpen], Claimed: m[tracing.JobClaimed],
			Fulfilled: m[tracing.JobFulfilled], Dead: m[tracing.JobDead]})
	}
	slices.SortFunc(qs, func(a, b jobQueue) int { return strings.Compare(a.Namespace, b.Namespace) })
	conv := func(rows []tracing.JobRow) []jobView {
		out := make([]jobView, 0, len(rows))
		for i := range rows {
			out = append(out, jobViewOf(&rows[i]))
		}
		return out
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"enabled": true, "queues": append([]jobQueue{}, qs...),
		"recent": conv(j.Recent(50, false)), "dead": conv(j.Recent(100, true)), "canAct": p.role == roleAdmin})
	return nil
}

// handleJobAction answers POST /observability/jobs/{id}/retry and /cancel.
func (d *Dashboard) handleJobAction(op string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, _ principal) error {
		j := d.jobs()
		if j == nil {
			return httpjson.New(http.StatusNotFound, "NOT_FOUND", "the intent bus is not running")
		}
		id := r.PathValue("id")
		act := j.Retry
		if op == "cancel" {
			act = j.Cancel
		}
		st, err := act(r.Context(), id)
		if err != nil {
			switch {
			case errors.Is(err, jobs.ErrNotFound):
				return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no such job")
			case errors.Is(err, jobs.ErrInvalidState):
				return httpjson.New(http.StatusConflict, "INVALID_STATE", err.Error())
			default:
				return httpjson.Internal("job "+op+" failed", err)
			}
		}
		httpjson.Write(w, http.StatusOK, map[string]any{"id": id, "status": st})
		return nil
	}
}
