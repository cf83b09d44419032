package replay

import (
	"sync"
	"time"
)

// Set remembers used nonces until they expire. The zero Set is empty and
// ready; it is safe for concurrent use.
type Set struct {
	mu sync.Mutex
	m  map[string]time.Time // nonce → expiry
}

// Seen reports whether key is remembered and not expired at now.
func (s *Set) Seen(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.m[key]
	return ok && now.Before(exp)
}

// Use remembers key until expires and reports whether it was new: false
// means key was already remembered and has not expired at now (a replay),
// and then nothing changes.
func (s *Set) Use(key string, now, expires time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if exp, ok := s.m[key]; ok && now.Before(exp) {
		return false
	}
	if s.m == nil {
		s.m = map[string]time.Time{}
	}
	s.m[key] = expires
	return true
}

// Sweep forgets the nonces expired at now and those drop (when not nil)
// reports, and returns how many it forgot. The zero now expires nothing.
func (s *Set) Sweep(now time.Time, drop func(key string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := 0
	for k, exp := range s.m {
		if !now.Before(exp) || (drop != nil && drop(k)) {
			delete(s.m, k)
			c++
		}
	}
	return c
}

// Len returns how many nonces the set holds, expired ones not yet swept
// included.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
