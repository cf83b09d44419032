package jobs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/internal/replay"
	"github.com/beamdir/beam/tracing"
)

// noncePrefix starts the log nonce of every job.
const noncePrefix = "job:"

// Service is a running job bus. Its methods are safe for concurrent use.
type Service struct {
	cfg   Config
	log   *tracing.Log
	lg    *slog.Logger
	clock func() time.Time
	rand  io.Reader

	mu    sync.Mutex
	jobs  map[string]*job
	ready map[string]map[groupKey]*group // namespace → group
	// delayed holds the open jobs by run_at until they are due, leases the
	// claimed jobs by claim expiry.
	delayed attempt.Due[*job]
	leases  attempt.Due[*job]
	open    map[string]int // open+claimed jobs per publisher digest
	// counts holds jobs by namespace and status; dead the dead jobs. Both
	// follow every change of s.jobs (track), so reads never scan.
	counts map[string]map[string]int
	dead   map[string]*job
	keys   map[string]string
	kv     map[string]kvEntry
	idem   map[string]*idemEntry
	nonces replay.Set
	rates  map[string]*rateWindow

	lastCleanup time.Time
	cleanupMu   sync.Mutex

	// loop acts on expired leases and due delays every ReapInterval and
	// runs the retention pass (reap).
	loop attempt.Loop
}

type kvEntry struct {
	value   string // JSON text of the value as stored
	expires int64
}

type idemEntry struct {
	hash    string
	status  int
	body    []byte
	created int64
	pending bool
}

// Open loads the jobs from the log and the tables, and starts the reaper
// and the retention pass. Close stops them.
func Open(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, log: cfg.Log, lg: cfg.Logger.With("component", "intent-bus"), clock: cfg.Clock, rand: cfg.Rand,
		jobs: map[string]*job{}, ready: map[string]map[groupKey]*group{},
		open: map[string]int{}, counts: map[string]map[string]int{}, dead: map[string]*job{}, keys: map[string]string{}, kv: map[string]kvEntry{}, idem: map[string]*idemEntry{},
		rates: map[string]*rateWindow{},
	}
	if s.rand == nil {
		s.rand = rand.Reader
	}
	s.lastCleanup = s.clock()
	tomb, err := s.loadTables(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.loadJobs(ctx, tomb); err != nil {
		return nil, err
	}
	s.loop = attempt.Loop{Interval: cfg.ReapInterval, Tick: s.reap, Logger: s.lg, Name: "intent-bus"}
	s.loop.Start(context.Background())
	return s, nil
}

// Close stops the background passes. It does not close the log.
func (s *Service) Close() error {
	s.loop.Close()
	return nil
}

// loadJobs reads the jobs from their projection (beam_jobs, which the
// log keeps current) and indexes them, and remembers the signed nonces the
// rows hold.
func (s *Service) loadJobs(ctx context.Context, tomb map[string]bool) error {
	var rows []tracing.JobRow
	now := s.clock().Unix()
	err := s.log.OwnedRows(ctx, tracing.OwnerJobs, func(nonce string, b []byte) error {
		r, err := s.readRow(nonce, b, now)
		if r.ID != "" {
			rows = append(rows, r)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("load jobs: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rows {
		if tomb[r.ID] || r.Purged {
			continue
		}
		s.add(newJob(r))
	}
	s.lg.Info("intent bus loaded", "jobs", len(s.jobs), "testerKeys", len(s.keys))
	return nil
}

// readRow decodes nonce's stored projection row b and remembers the signed
// nonces it holds (now: unix s).
func (s *Service) readRow(nonce string, b []byte, now int64) (tracing.JobRow, error) {
	var r jobRow
	if err := r.UnmarshalBinary(b); err != nil {
		return tracing.JobRow{}, fmt.Errorf("job row %s: %w", nonce, err)
	}
	for _, u := range r.signed {
		s.rememberNonce(u.Key, u.usedAt(), now)
	}
	return r.row, nil
}

// add puts the loaded job j in the service: the jobs, the counts and the
// claim index. Caller holds mu.
func (s *Service) add(j *job) {
	s.jobs[j.row.ID] = j
	s.track(j, 1)
	s.slim(j)
	s.index(j)
}

// track adds (delta 1) or removes (-1) j from the counts, its publisher's
// open+claimed count and the dead set. Only a committed status change
// moves a job between them, so a job in flight (busy, out of the claim
// index) still counts against its publisher's OpenCap. Caller holds mu.
func (s *Service) track(j *job, delta int) {
	m := s.counts[j.row.Namespace]
	if m == nil {
		m = map[string]int{}
		s.counts[j.row.Namespace] = m
	}
	m[j.row.Status] += delta
	if m[j.row.Status] <= 0 {
		delete(m, j.row.Status)
		if len(m) == 0 {
			delete(s.counts, j.row.Namespace)
		}
	}
	if j.row.Status == tracing.JobOpen || j.row.Status == tracing.JobClaimed {
		s.addOpen(j.row.Publisher, delta)
	}
	if j.row.Status == tracing.JobDead {
		if delta > 0 {
			s.dead[j.row.ID] = j
		} else {
			delete(s.dead, j.row.ID)
		}
	}
}

// addOpen adds delta to the open+claimed count of publisher. Caller holds
// mu.
func (s *Service) addOpen(publisher string, delta int) {
	if s.open[publisher] += delta; s.open[publisher] <= 0 {
		delete(s.open, publisher)
	}
}

// slim drops the payload of a fulfilled job from memory (it can never be
// claimed again); the admin view reads it back from the log.
func (s *Service) slim(j *job) {
	if j.row.Status == tracing.JobFulfilled {
		j.row.Payload = nil
	}
}

// index puts j in the claim index its status calls for. Caller holds mu.
func (s *Service) index(j *job) {
	switch j.row.Status {
	case tracing.JobOpen:
		if j.row.RunAt > s.clock().UnixMilli() {
			s.delayed.Set(j, time.UnixMilli(j.row.RunAt))
		} else {
			s.addReady(j)
		}
	case tracing.JobClaimed:
		s.leases.Set(j, time.UnixMilli(j.row.ClaimExpiresAt))
	}
}

// unindex takes j out of every index. Caller holds mu.
func (s *Service) unindex(j *job) {
	if j.grp != nil {
		j.grp.h.remove(j)
		j.grp = nil
	}
	s.delayed.Remove(j)
	s.leases.Remove(j)
}

func (s *Service) addReady(j *job) {
	ns := s.ready[j.row.Namespace]
	if ns == nil {
		ns = map[groupKey]*group{}
		s.ready[j.row.Namespace] = ns
	}
	k := keyOf(&j.row)
	g := ns[k]
	if g == nil {
		g = &group{key: k, h: newReadyHeap()}
		ns[k] = g
	}
	j.grp = g
	g.h.add(j)
}

// promote moves the delayed jobs that are due to the ready heaps. Caller
// holds mu.
func (s *Service) promote(nowMs int64) {
	for _, j := range s.delayed.PopDue(time.UnixMilli(nowMs), 0) {
		s.addReady(j)
	}
}

// newID returns n random bytes in hex.
func (s *Service) newID(n int) (string, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(s.rand, b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// backoff is backoff_base·2^attempts + [0,2) s, the first term capped at
// intentTTL (RFC §3.3).
func (s *Service) backoff(r *tracing.JobRow) time.Duration {
	b := attempt.Backoff{Growth: attempt.Exponential, Initial: time.Duration(r.BackoffBase * float64(time.Second)),
		Max: intentTTL, Spread: 2 * time.Second}
	return b.Delay(r.ClaimAttempts+1, s.draw())
}

// draw returns a random number in [0, 1) (0.5 when the source fails).
func (s *Service) draw() float64 {
	var b [8]byte
	if _, err := io.ReadFull(s.rand, b[:]); err != nil {
		return 0.5
	}
	return float64(binary.BigEndian.Uint64(b[:])>>11) / (1 << 53)
}

func hashHex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// keyDigest identifies an API key in the log and the projections.
func keyDigest(key string) string { return hashHex(key)[:32] }

// events builds the log events of op moving r to status to.
func (s *Service) events(r *tracing.JobRow, op Op, to string, jd tracing.JobDetails, at time.Time) []tracing.Event {
	states := statesFor(op, to)
	out := make([]tracing.Event, len(states))
	for i, st := range states {
		d := jd
		if i > 0 {
			d = tracing.JobDetails{Op: "accept"}
			if op == OpPublish {
				d = tracing.JobDetails{Op: "queue", RunAt: jd.RunAt}
			}
		}
		ev := tracing.Event{Nonce: r.Nonce, State: st, At: at, Transport: "intent", Details: tracing.Details{Job: &d}}
		if op == OpPublish && i == 0 {
			ev.From = "intent:" + r.Publisher
			ev.To = "intent:" + r.Namespace
			ev.IntentType = r.Goal
			ev.Details.Owner = tracing.OwnerJobs
		}
		if op == OpClaim {
			ev.Attempt = r.ClaimAttempts + 1
		}
		out[i] = ev
	}
	return out
}

// commit appends evs for j (which the caller marked busy) and folds the
// committed events into j, then re-indexes it. On error j is re-indexed as
// it was.
func (s *Service) commit(ctx context.Context, j *job, evs []tracing.Event) error {
	done, err := s.append(ctx, evs...)
	s.mu.Lock()
	defer s.mu.Unlock()
	j.busy = false
	if err != nil {
		s.index(j)
		return fmt.Errorf("append job events: %w", err)
	}
	s.track(j, -1)
	for _, ev := range done {
		j.row.Apply(ev)
	}
	s.track(j, 1)
	s.slim(j)
	s.index(j)
	s.notify(done)
	return nil
}

func (s *Service) notify(evs []tracing.Event) {
	if s.cfg.OnEvent == nil {
		return
	}
	for _, ev := range evs {
		s.cfg.OnEvent(ev)
	}
}

// errLeaseLost is the 404 of a mutation whose claim is not (or no longer)
// the caller's.
var errLeaseLost = errors.New("lease lost")

// errBusy says another operation on the same job is in flight.
var errBusy = errors.New("job busy")

// holdClaim checks that the caller holds j's current, unexpired claim with
// token, and marks j busy. Caller holds mu.
func (s *Service) holdClaim(j *job, caller, token string, now int64) error {
	if j == nil || j.busy || j.row.Status != tracing.JobClaimed || j.row.ClaimedBy != caller ||
		j.row.ClaimExpiresAt <= now ||
		subtle.ConstantTimeCompare([]byte(hashHex(token)), []byte(j.row.TokenHash)) != 1 {
		return errLeaseLost
	}
	s.unindex(j)
	j.busy = true
	return nil
}
