package attempt

import (
	"hash/maphash"
	"sync"
)

// stripes is the number of mutexes of a Keyed.
const stripes = 64

// Keyed serializes the state changes of one key (a nonce, an envelope id,
// a job id): Lock(k) excludes every other Lock of k, and of the keys that
// share its stripe. The zero value is ready to use.
type Keyed struct {
	once sync.Once
	seed maphash.Seed
	mu   [stripes]sync.Mutex
}

// Lock locks key and returns its unlock.
func (l *Keyed) Lock(key string) (unlock func()) {
	l.once.Do(func() { l.seed = maphash.MakeSeed() })
	mu := &l.mu[maphash.String(l.seed, key)%stripes]
	mu.Lock()
	return mu.Unlock
}
