package mesh

import (
	"bytes"
	"hash/maphash"
	"sync"
)

// memoMax bounds the decoded envelopes kept by envelopeMemo; the memo is
// emptied when it is full.
const memoMax = 4096

// envelopeMemo remembers DecodeEnvelope's results by the envelope's bytes.
// A stored envelope changes only when a hop moves it, while every step,
// status read and SSE event of an envelope decodes it again, so most
// decodes are of bytes seen before. DecodeEnvelope is a pure function of
// the bytes, and a hit compares them in full, so the memo never changes a
// result.
type envelopeMemo struct {
	seed maphash.Seed
	mu   sync.Mutex
	m    map[uint64]memoEntry
}

type memoEntry struct {
	raw []byte
	env Envelope
}

var envelopes = &envelopeMemo{seed: maphash.MakeSeed(), m: map[uint64]memoEntry{}}

// decode returns DecodeEnvelope(b), as a copy the caller may change.
func (c *envelopeMemo) decode(b []byte) (Envelope, error) {
	h := maphash.Bytes(c.seed, b)
	c.mu.Lock()
	got, ok := c.m[h]
	c.mu.Unlock()
	if ok && bytes.Equal(got.raw, b) {
		return got.env.clone(), nil
	}
	env, err := DecodeEnvelope(b)
	if err != nil {
		return env, err
	}
	c.mu.Lock()
	if len(c.m) >= memoMax {
		clear(c.m)
	}
	c.m[h] = memoEntry{raw: bytes.Clone(b), env: env.clone()}
	c.mu.Unlock()
	return env, nil
}
