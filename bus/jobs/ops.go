package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// publishReq is a validated POST /intent.
type publishReq struct {
	goal, namespace, visibility, target, capability string
	payload                                         []byte
	priority, maxAttempts                           int
	delay, backoffBase                              float64
}

// publishResp is the body of a 201 from POST /intent.
type publishResp struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	Namespace string `json:"namespace"`
}

// publish records a new job. idemKey (with bodyHash) makes it idempotent
// per caller. It returns the status and body to answer.
func (s *Service) publish(ctx context.Context, p *publishReq, c *principal, idemKey, bodyHash string) (int, []byte, error) {
	now := s.clock()
	scope := c.digest + "\x00" + idemKey
	s.mu.Lock()
	if idemKey != "" {
		if e := s.idem[scope]; e != nil && e.created+idempotencyTTL.Milliseconds() > now.UnixMilli() {
			s.mu.Unlock()
			switch {
			case e.hash != bodyHash:
				return 0, nil, httpjson.New(http.StatusUnprocessableEntity, "idempotency_conflict",
					"Idempotency-Key was already used with a different request body.")
			case e.pending:
				return 0, nil, &httpjson.Error{Status: http.StatusConflict, Code: "idempotency_in_progress",
					Message: "A request with this Idempotency-Key is still being processed.", RetryAfter: time.Second}
			}
			return e.status, e.body, nil
		}
	}
	if c.tester && s.open[c.digest] >= s.cfg.OpenCap {
		s.mu.Unlock()
		return 0, nil, &httpjson.Error{Status: http.StatusTooManyRequests, Code: "limit_exceeded",
			Message: fmt.Sprintf("Open intent limit reached (%d open or claimed intents per key).", s.cfg.OpenCap), RetryAfter: 60 * time.Second}
	}
	s.open[c.digest]++ // reserved until the job is indexed
	var pending *idemEntry
	if idemKey != "" {
		pending = &idemEntry{hash: bodyHash, pending: true, created: now.UnixMilli()}
		s.idem[scope] = pending
	}
	s.mu.Unlock()
	release := func() {
		s.mu.Lock()
		s.addOpen(c.digest, -1)
		if pending != nil && s.idem[scope] == pending {
			delete(s.idem, scope)
		}
		s.mu.Unlock()
	}

	id, err := s.newID(16)
	if err != nil {
		release()
		return 0, nil, err
	}
	prio := p.priority
	row := tracing.JobRow{ID: id, Nonce: noncePrefix + id, Namespace: p.namespace, Goal: p.goal, Publisher: c.digest}
	jd := tracing.JobDetails{
		Op: string(OpPublish), ID: id, Namespace: p.namespace, Goal: p.goal, Payload: p.payload, Priority: &prio,
		Visibility: p.visibility, TargetWorker: p.target, RequiredCapability: p.capability,
		MaxAttempts: p.maxAttempts, BackoffBase: p.backoffBase, Publisher: c.digest,
		ExpiresAt: now.Add(intentTTL).UnixMilli(),
		RunAt:     now.Add(time.Duration(p.delay * float64(time.Second))).UnixMilli(),
	}
	if !allowed("", tracing.JobOpen, OpPublish) {
		release()
		return 0, nil, errors.New("publish not in the transition table")
	}
	evs := s.events(&row, OpPublish, tracing.JobOpen, jd, now)
	body, _ := json.Marshal(publishResp{ID: id, Status: "published", Namespace: p.namespace})
	var done []tracing.Event
	if idemKey != "" {
		done, err = s.doOps(ctx, []tracing.Op{op(opIdemPut, tableOp{Scope: c.digest, Key: idemKey, BodyHash: bodyHash,
			Status: http.StatusCreated, Response: string(body), At: msToSecs(now.UnixMilli())})}, evs...)
	} else {
		done, err = s.append(ctx, evs...)
	}
	if err != nil {
		release()
		return 0, nil, fmt.Errorf("publish: %w", err)
	}
	j := newJob(tracing.JobRow{})
	for _, ev := range done {
		j.row.Apply(ev)
	}
	s.mu.Lock()
	s.jobs[id] = j
	s.track(j, 1)
	s.index(j)
	s.addOpen(c.digest, -1) // the reservation: track counted the job
	if pending != nil {
		pending.status, pending.body, pending.pending = http.StatusCreated, body, false
	}
	s.notify(done)
	s.mu.Unlock()
	return http.StatusCreated, body, nil
}

// claimed is a successful claim: the job row after the claim and the
// token, which exists only in this answer.
type claimed struct {
	row   tracing.JobRow
	token string
}

// claim atomically takes the best eligible job for f, or returns nil.
func (s *Service) claim(ctx context.Context, f *claimFilter) (*claimed, error) {
	now := s.clock()
	nowMs := now.UnixMilli()
	s.mu.Lock()
	s.promote(nowMs)
	var best *job
	for _, g := range s.ready[f.namespace] {
		if !g.key.eligible(f) {
			continue
		}
		t := g.h.top()
		for t != nil && t.row.ExpiresAt <= nowMs { // past its TTL: the retention pass deletes it
			g.h.remove(t)
			t.grp = nil
			t = g.h.top()
		}
		if t != nil && (best == nil || before(t, best)) {
			best = t
		}
	}
	if best == nil {
		s.mu.Unlock()
		return nil, nil
	}
	if !allowed(best.row.Status, tracing.JobClaimed, OpClaim) {
		s.mu.Unlock()
		return nil, fmt.Errorf("claim %s: status %s", best.row.ID, best.row.Status)
	}
	s.unindex(best)
	best.busy = true
	s.mu.Unlock()

	token, err := s.newID(16)
	if err != nil {
		s.release(best)
		return nil, err
	}
	attempts := best.row.ClaimAttempts + 1
	jd := tracing.JobDetails{Op: string(OpClaim), ClaimedBy: f.caller, TokenHash: hashHex(token),
		LeaseExpiresAt: now.Add(s.cfg.ClaimTimeout).UnixMilli(), Attempts: &attempts}
	if err := s.commit(ctx, best, s.events(&best.row, OpClaim, tracing.JobClaimed, jd, now)); err != nil {
		return nil, err
	}
	s.mu.Lock()
	row := best.row
	s.mu.Unlock()
	return &claimed{row: row, token: token}, nil
}

// release clears busy after a failure before any append.
func (s *Service) release(j *job) {
	s.mu.Lock()
	j.busy = false
	s.index(j)
	s.mu.Unlock()
}

// extend moves the lease of the caller's claim to now+d.
func (s *Service) extend(ctx context.Context, id string, c *principal, token string, d time.Duration) error {
	now := s.clock()
	s.mu.Lock()
	j := s.jobs[id]
	if err := s.holdClaim(j, c.digest, token, now.UnixMilli()); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	jd := tracing.JobDetails{Op: string(OpExtend), LeaseExpiresAt: now.Add(d).UnixMilli()}
	return s.commit(ctx, j, s.events(&j.row, OpExtend, tracing.JobClaimed, jd, now))
}

// fulfill finishes the caller's claim with an optional result.
func (s *Service) fulfill(ctx context.Context, id string, c *principal, token string, result []byte, resultType string) error {
	now := s.clock()
	s.mu.Lock()
	j := s.jobs[id]
	if err := s.holdClaim(j, c.digest, token, now.UnixMilli()); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	jd := tracing.JobDetails{Op: string(OpFulfill), Result: result, ResultType: resultType}
	return s.commit(ctx, j, s.events(&j.row, OpFulfill, tracing.JobFulfilled, jd, now))
}

// fail gives the caller's claim up: requeued with backoff, or dead when its
// attempts are exhausted.
func (s *Service) fail(ctx context.Context, id string, c *principal, token, msg string) error {
	now := s.clock()
	s.mu.Lock()
	j := s.jobs[id]
	if err := s.holdClaim(j, c.digest, token, now.UnixMilli()); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	return s.commit(ctx, j, s.giveUp(j, OpFail, msg, now))
}

// The last_error of a lease that ran out: with attempts left (the
// reference's wording) and on the last attempt.
const (
	leaseExpiredRetry = "Lease expired. Backing off."
	leaseExpiredDead  = "Lease expired. No attempts left."
)

// giveUp builds the events of a fail (msg is the worker's error) or an
// expiry (msg is ignored) of j's claim. A dead job's reason is the error as
// the worker gave it, as the reference stores it: scripts match on it.
func (s *Service) giveUp(j *job, op Op, msg string, now time.Time) []tracing.Event {
	if j.row.ClaimAttempts >= j.row.MaxAttempts {
		if op == OpExpire {
			msg = leaseExpiredDead
		}
		jd := tracing.JobDetails{Op: string(op), Error: msg, Reason: msg}
		return s.events(&j.row, op, tracing.JobDead, jd, now)
	}
	if op == OpExpire {
		msg = leaseExpiredRetry
	}
	jd := tracing.JobDetails{Op: string(op), Error: msg, RunAt: now.Add(s.backoff(&j.row)).UnixMilli()}
	return s.events(&j.row, op, tracing.JobOpen, jd, now)
}

// maxExpirePass bounds the expirations of one pass (one append); the next
// pass takes the rest.
const maxExpirePass = 512

// expire acts on the leases that have run out (up to maxExpirePass):
// requeue with backoff, or dead on the last attempt. It returns how many
// went each way.
func (s *Service) expire(ctx context.Context) (requeued, dead int) {
	now := s.clock()
	nowMs := now.UnixMilli()
	s.mu.Lock()
	taken := s.leases.PopDue(time.UnixMilli(nowMs), maxExpirePass)
	for _, j := range taken {
		s.unindex(j)
		j.busy = true
	}
	s.mu.Unlock()
	if len(taken) == 0 {
		return 0, 0
	}
	// One append for all of them: a restart with many abandoned leases
	// settles them in one commit.
	var evs []tracing.Event
	for _, j := range taken {
		evs = append(evs, s.giveUp(j, OpExpire, "", now)...)
	}
	done, err := s.log.Append(ctx, evs...)
	s.mu.Lock()
	defer s.mu.Unlock()
	byNonce := make(map[string]*job, len(taken))
	for _, j := range taken {
		j.busy = false
		byNonce[j.row.Nonce] = j
		if err != nil {
			s.index(j)
		} else {
			s.track(j, -1)
		}
	}
	if err != nil {
		s.lg.Warn("lease expiry", "jobs", len(taken), "err", err)
		return 0, 0
	}
	for _, ev := range done {
		byNonce[ev.Nonce].row.Apply(ev)
	}
	for _, j := range taken {
		s.track(j, 1)
		s.index(j)
		if j.row.Status == tracing.JobDead {
			dead++
		} else {
			requeued++
		}
	}
	s.notify(done)
	return requeued, dead
}

// ErrNotFound is returned by Cancel and Retry for an unknown job.
var ErrNotFound = errors.New("job not found")

// ErrInvalidState is wrapped by the error of an admin operation that the
// job's status does not allow.
var ErrInvalidState = errors.New("not allowed in this status")

// errState is an admin operation that the job's status does not allow.
type errState struct{ status string }

func (e *errState) Error() string { return "not allowed in status " + e.status }

func (e *errState) Unwrap() error { return ErrInvalidState }

// adminMove applies an admin cancel or retry.
func (s *Service) adminMove(ctx context.Context, id string, op Op) (string, error) {
	now := s.clock()
	to := tracing.JobDead
	if op == OpRetry {
		to = tracing.JobOpen
	}
	s.mu.Lock()
	j := s.jobs[id]
	switch {
	case j == nil:
		s.mu.Unlock()
		return "", ErrNotFound
	case j.busy:
		s.mu.Unlock()
		return "", errBusy
	case op == OpCancel && j.row.Status == tracing.JobDead:
		s.mu.Unlock()
		return tracing.JobDead, nil // already dead: nothing to record
	case !allowed(j.row.Status, to, op):
		st := j.row.Status
		s.mu.Unlock()
		return "", &errState{status: st}
	}
	s.unindex(j)
	j.busy = true
	s.mu.Unlock()
	var jd tracing.JobDetails
	if op == OpRetry {
		zero := 0
		jd = tracing.JobDetails{Op: string(OpRetry), Attempts: &zero, RunAt: now.UnixMilli(), Error: "Retried by admin"}
	} else {
		jd = tracing.JobDetails{Op: string(OpCancel), Reason: "Cancelled by admin", Error: "Cancelled by admin"}
	}
	if err := s.commit(ctx, j, s.events(&j.row, op, to, jd, now)); err != nil {
		return "", err
	}
	return to, nil
}

// view returns a copy of a job's row.
func (s *Service) view(id string) (tracing.JobRow, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[id]
	if j == nil {
		return tracing.JobRow{}, false
	}
	return j.row, true
}

// remove deletes jobs from the projection for good: non-terminal ones get a
// dead_letter event (op purge), all get a tombstone, in one call.
func (s *Service) remove(ctx context.Context, reason string, pick func(*tracing.JobRow) bool) (int, error) {
	now := s.clock()
	s.mu.Lock()
	var taken []*job
	var evs []tracing.Event
	for _, j := range s.jobs {
		if j.busy || !pick(&j.row) {
			continue
		}
		s.unindex(j)
		j.busy = true
		taken = append(taken, j)
		if allowed(j.row.Status, tracing.JobDead, OpPurge) {
			evs = append(evs, s.events(&j.row, OpPurge, tracing.JobDead,
				tracing.JobDetails{Op: string(OpPurge), Reason: reason}, now)...)
		}
	}
	s.mu.Unlock()
	if len(taken) == 0 {
		return 0, nil
	}
	ids := make([]string, len(taken))
	for i, j := range taken {
		ids[i] = j.row.ID
	}
	_, err := s.log.DoOps(ctx, []tracing.Op{op(opTombstones, tableOp{IDs: ids, At: msToSecs(now.UnixMilli())})}, evs...)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, j := range taken {
		j.busy = false
		if err != nil {
			s.index(j)
		} else {
			s.track(j, -1)
			delete(s.jobs, j.row.ID)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("remove jobs: %w", err)
	}
	return len(taken), nil
}
