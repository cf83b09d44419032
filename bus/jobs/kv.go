package jobs

import (
	"context"
	"crypto/subtle"
	"fmt"
	"time"

	"github.com/beamdir/beam/tracing"
)

func constEq(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// set stores a KV value (JSON text) in the caller's scope.
func (s *Service) set(ctx context.Context, scope, key, value string, ttl time.Duration) error {
	exp := s.clock().Add(ttl).UnixMilli()
	_, err := s.doOps(ctx, []tracing.Op{op(opKVSet, tableOp{Scope: scope, Key: key, Value: value, Until: msToSecs(exp)})})
	if err != nil {
		return fmt.Errorf("kv set: %w", err)
	}
	s.mu.Lock()
	s.kv[scope+"\x00"+key] = kvEntry{value: value, expires: exp}
	s.mu.Unlock()
	return nil
}

// get returns the JSON text of a live KV value of the caller's scope.
func (s *Service) get(scope, key string) (string, bool) {
	now := s.clock().UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.kv[scope+"\x00"+key]
	if !ok || e.expires <= now {
		return "", false
	}
	return e.value, true
}
