package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/beamdir/beam/tracing"
)

// cleanupStats is the answer of POST /admin/cleanup (RFC §8.4).
type cleanupStats struct {
	ExpiredOpenDeleted    int `json:"expired_open_deleted"`
	ExpiredClaimsRequeued int `json:"expired_claims_requeued"`
	ExpiredClaimsDead     int `json:"expired_claims_dead"`
	FulfilledDeleted      int `json:"fulfilled_deleted"`
	DeadDeleted           int `json:"dead_deleted"`
	DeadLettersDeleted    int `json:"dead_letters_deleted"`
	StoreDeleted          int `json:"store_deleted"`
	RateLimitsDeleted     int `json:"rate_limits_deleted"`
	IdempotencyDeleted    int `json:"idempotency_deleted"`
	NoncesDeleted         int `json:"nonces_deleted"`
}

// Cleanup runs the retention pass now: expired leases, expired open
// intents (deleted, not dead), fulfilled and dead intents past retention,
// expired KV entries, idempotency keys, rate windows and nonces.
func (s *Service) Cleanup(ctx context.Context) (cleanupStats, error) {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	var st cleanupStats
	st.ExpiredClaimsRequeued, st.ExpiredClaimsDead = s.expire(ctx)
	now := s.clock()
	nowMs := now.UnixMilli()
	keep := nowMs - retention.Milliseconds()
	var err error
	var n int
	n, err = s.remove(ctx, "Expired before it was claimed", func(r *tracing.JobRow) bool {
		return r.Status == tracing.JobOpen && r.ExpiresAt <= nowMs
	})
	if err != nil {
		return st, err
	}
	st.ExpiredOpenDeleted = n
	if n, err = s.remove(ctx, "", func(r *tracing.JobRow) bool { return r.Status == tracing.JobFulfilled && r.CompletedAt < keep }); err != nil {
		return st, err
	}
	st.FulfilledDeleted = n
	if n, err = s.remove(ctx, "", func(r *tracing.JobRow) bool { return r.Status == tracing.JobDead && r.DeadAt < keep }); err != nil {
		return st, err
	}
	st.DeadDeleted, st.DeadLettersDeleted = n, n

	var kvGone []string
	s.mu.Lock()
	for k, e := range s.kv {
		if e.expires <= nowMs {
			kvGone = append(kvGone, k)
		}
	}
	var idemGone []string
	for k, e := range s.idem {
		if !e.pending && e.created+idempotencyTTL.Milliseconds() <= nowMs {
			idemGone = append(idemGone, k)
		}
	}
	for k, w := range s.rates {
		if now.Unix()-w.start >= 60 {
			delete(s.rates, k)
			st.RateLimitsDeleted++
		}
	}
	s.mu.Unlock()
	if len(kvGone) > 0 || len(idemGone) > 0 {
		if _, err := s.log.DoOps(ctx, []tracing.Op{op(opExpire, tableOp{Before: msToSecs(nowMs),
			IdemBefore: msToSecs(nowMs - idempotencyTTL.Milliseconds())})}); err != nil {
			return st, err
		}
		s.mu.Lock()
		for _, k := range kvGone {
			if e, ok := s.kv[k]; ok && e.expires <= nowMs {
				delete(s.kv, k)
				st.StoreDeleted++
			}
		}
		for _, k := range idemGone {
			delete(s.idem, k)
			st.IdempotencyDeleted++
		}
		s.mu.Unlock()
	}
	if _, err := s.log.DoOps(ctx, []tracing.Op{op(opNoncesExpire, tableOp{Before: float64(now.Unix())})}); err != nil {
		return st, err
	}
	st.NoncesDeleted = s.nonces.Sweep(time.Unix(now.Unix(), 0), nil)
	s.mu.Lock()
	s.lastCleanup = now
	s.mu.Unlock()
	return st, nil
}

// reap acts on expired leases and due delays (the loop's tick, every
// ReapInterval) and runs the retention pass every CleanupInterval.
func (s *Service) reap(context.Context) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.expire(ctx)
	s.mu.Lock()
	s.promote(s.clock().UnixMilli())
	due := s.clock().Sub(s.lastCleanup) >= s.cfg.CleanupInterval
	s.mu.Unlock()
	if due {
		if _, err := s.Cleanup(ctx); err != nil {
			return fmt.Errorf("intent bus cleanup: %w", err)
		}
	}
	return nil
}
