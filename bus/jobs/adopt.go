package jobs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/beamdir/beam/tracing"
)

// opTakeover is details.job.op of the event that marks a job adopted after
// a takeover. It keeps the job's status, so the job lifecycle sees no
// transition (jobStep).
const opTakeover = "takeover"

// Adopt takes over jobs (ids or their log nonces) that a takeover imported
// into this log from a dead node's log while the service runs: each one
// whose latest event is the imported one (tracing.Log.Adoptable) and that
// the service does not have is loaded from its projection row and indexed
// as Open indexes the jobs at startup: an open job in its ready heap or
// its delay, a claimed one under its lease as it was (the worker holding
// its claim token may still extend, fulfil or fail it until the lease
// ends; then the reaper requeues it), a finished one for reads. An open or
// claimed job gets one event of transport tracing.TransportTakeover in its
// trace. A job is never indexed twice: calling Adopt again adopts nothing.
// It returns how many jobs it adopted.
func (s *Service) Adopt(ctx context.Context, ids []string) (int, error) {
	n, err := tracing.AdoptEach(ids, func(id string) (bool, error) {
		return s.adoptOne(ctx, strings.TrimPrefix(id, noncePrefix))
	})
	if n > 0 {
		s.lg.Info("intent bus adopted jobs", "jobs", n)
	}
	return n, err
}

// adoptOne adopts job id and reports whether it did.
func (s *Service) adoptOne(ctx context.Context, id string) (bool, error) {
	nonce := noncePrefix + id
	s.mu.Lock()
	have := s.jobs[id] != nil
	s.mu.Unlock()
	if have {
		return false, nil
	}
	from, ok, err := s.log.Adoptable(ctx, nonce)
	if err != nil || !ok {
		return false, err
	}
	b, ok, err := s.log.OwnedRow(ctx, tracing.OwnerJobs, nonce)
	if err != nil || !ok {
		return false, err
	}
	r, err := s.readRow(nonce, b, s.clock().Unix())
	if err != nil || r.ID != id || r.Purged {
		return false, err
	}
	var one int
	err = s.log.ReadDB().QueryRowContext(ctx, `SELECT 1 FROM intent_bus_tombstones WHERE job_id = ?`, id).Scan(&one)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("read tombstone: %w", err)
	}
	s.mu.Lock()
	if s.jobs[id] != nil {
		s.mu.Unlock()
		return false, nil
	}
	j := newJob(r)
	if r.Status != tracing.JobOpen && r.Status != tracing.JobClaimed {
		s.add(j)
		s.mu.Unlock()
		return true, nil
	}
	// Counted now, indexed once its marker is committed (commit).
	s.jobs[id] = j
	s.track(j, 1)
	j.busy = true
	s.mu.Unlock()
	state := tracing.Queued
	if r.Status == tracing.JobClaimed {
		state = tracing.Delivered
	}
	ev := tracing.Event{Nonce: nonce, State: state, At: s.clock(), Transport: tracing.TransportTakeover,
		Details: tracing.Details{Job: &tracing.JobDetails{Op: opTakeover}, Extra: from.Marker(nil)}}
	return true, s.commit(ctx, j, []tracing.Event{ev})
}
