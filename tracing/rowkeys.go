package tracing

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
)

// rowKeys tells the writer which nonces and bus message ids certainly have
// no projection row, so that a batch of new intents needs no look-up in
// intent_log or beam_messages before its first events are written.
//
// It holds two sets: scanned, the keys of the rows that were in the file
// when the log opened, read by a goroutine after Open (nil until then, and
// while nil every key counts as possibly present), and added, the keys of
// every row the writer has inserted since it was prepared. Rows of the two
// tables are inserted only by the writer's flush and write, which add their
// keys before the insert, so the two sets together hold every row's key:
// a row inserted before the scan's read transaction began is in scanned, any
// later one was inserted by this writer. Keys are never removed; a row that
// was deleted (Rebuild) or rolled back only costs a look-up.
type rowKeys struct {
	scanned atomic.Pointer[keySets]
	added   keySets // the writer's own
	// lookedUp counts the keys prefetch still read from SQLite (tests).
	lookedUp int
}

// keySets is a set of nonces and a set of bus message ids.
type keySets struct {
	nonces, ids keySet
}

// mayHaveNonce is false only if no intent_log row has nonce.
func (k *rowKeys) mayHaveNonce(nonce string) bool {
	s := k.scanned.Load()
	return s == nil || s.nonces.mayHave(nonce) || k.added.nonces.mayHave(nonce)
}

// mayHaveID is false only if no beam_messages row has id.
func (k *rowKeys) mayHaveID(id string) bool {
	s := k.scanned.Load()
	return s == nil || s.ids.mayHave(id) || k.added.ids.mayHave(id)
}

// keySetFalsePositives is the false-positive rate of each layer of a
// keySet: at 0.1 %, a batch of 64 new nonces needs a look-up one time in
// sixteen, for about 1.8 bytes per key.
const keySetFalsePositives = 0.001

// keySetFirst is the capacity of a keySet's first layer.
const keySetFirst = 1 << 14

// keySet is a Bloom filter that grows: a layer that reaches its capacity is
// followed by one of twice the capacity, so the false-positive rate stays
// bounded (by the layers' count times keySetFalsePositives) however many
// keys arrive. It answers "certainly absent" or "maybe present".
type keySet struct {
	layers []*bloom.BloomFilter
	n      uint // keys in the last layer
	cap    uint // the last layer's capacity
}

// add adds key.
func (s *keySet) add(key string) { s.addBytes([]byte(key)) }

// addBytes adds key.
func (s *keySet) addBytes(key []byte) {
	if len(s.layers) == 0 || s.n >= s.cap {
		c := uint(keySetFirst)
		if s.cap > 0 {
			c = 2 * s.cap
		}
		s.layers = append(s.layers, bloom.NewWithEstimates(c, keySetFalsePositives))
		s.n, s.cap = 0, c
	}
	s.layers[len(s.layers)-1].Add(key)
	s.n++
}

// mayHave is false only if key was never added.
func (s *keySet) mayHave(key string) bool {
	for _, l := range s.layers {
		if l.TestString(key) {
			return true
		}
	}
	return false
}

// scanRowKeys reads the keys of every intent_log and beam_messages row in
// one read transaction and installs them as w.rows.scanned. It runs on its
// own goroutine after Open, so that opening a large log does not wait for
// it; until it is done the writer looks every key up.
func (l *Log) scanRowKeys(ctx context.Context) error {
	t0 := time.Now()
	tx, err := l.rdb.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	s := &keySets{}
	for _, q := range []struct {
		set   *keySet
		query string
	}{
		{&s.nonces, `SELECT nonce FROM intent_log`},
		{&s.ids, `SELECT id FROM beam_messages`},
	} {
		rows, err := tx.QueryContext(ctx, q.query)
		if err != nil {
			return fmt.Errorf("read row keys: %w", err)
		}
		var key sql.RawBytes
		for rows.Next() {
			if err := rows.Scan(&key); err != nil {
				_ = rows.Close()
				return fmt.Errorf("read row keys: %w", err)
			}
			q.set.addBytes(key)
		}
		if err := rows.Close(); err != nil {
			return fmt.Errorf("read row keys: %w", err)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read row keys: %w", err)
		}
	}
	l.w.rows.scanned.Store(s)
	l.logger.Debug("read the projections' row keys", "took", time.Since(t0),
		"nonces", s.nonces.count(), "messages", s.ids.count())
	return nil
}

// count is the number of keys added.
func (s *keySet) count() uint {
	if len(s.layers) == 0 {
		return 0
	}
	// Every layer before the last is full; capacities double from keySetFirst.
	return s.cap - keySetFirst + s.n
}

// startRowKeyScan starts scanRowKeys; stopRowKeyScan stops it and waits.
func (l *Log) startRowKeyScan() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l.keyScan = func() {
		cancel()
		<-done
	}
	go func() {
		defer close(done)
		if err := l.scanRowKeys(ctx); err != nil && ctx.Err() == nil {
			l.logger.Warn("read the projections' row keys; every new nonce is looked up", "err", err)
		}
	}()
}

// stopRowKeyScan stops the scan started by startRowKeyScan, if any, and
// waits for it.
func (l *Log) stopRowKeyScan() {
	if l.keyScan != nil {
		l.keyScan()
	}
}
