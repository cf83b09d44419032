package mesh

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"sync"
)

// memoMax bounds the decoded envelopes kept by envelopeMemo; the memo is
// emptied when it is full.
const memoMax = 4096

// envelopeMemo remembers decodeEnvelope's results by the envelope's bytes.
// A stored envelope changes only when a hop moves it, while every step,
// status read and SSE event of an envelope decodes it again, so most
// decodes are of bytes seen before. decodeEnvelope is a pure function of
// the bytes, and a hit compares them in full, so the memo never changes a
// result.
type envelopeMemo struct {
	seed maphash.Seed
	mu   sync.Mutex
	m    map[uint64]memoEntry
}

type memoEntry struct {
	raw []byte
	env envelope
}

var envelopes = &envelopeMemo{seed: maphash.MakeSeed(), m: map[uint64]memoEntry{}}

// encodeStored returns encodeEnvelope(env) for a step of the log, remembering the
// envelope for those bytes: the stored envelope is decoded next by the
// step's SSE status event or the next hop, and needs no JSON decode then.
func encodeStored(env envelope) json.RawMessage {
	b := encodeEnvelope(env)
	envelopes.remember(b, env)
	return b
}

// remember records env as decodeEnvelope(b) for b = encodeEnvelope(env). It
// applies decodeEnvelope's checks and normalisation itself (Encode writes
// the payload compacted) and records nothing when they fail.
func (c *envelopeMemo) remember(b []byte, env envelope) {
	if len(b) > maxEnvelopeBytes {
		return
	}
	e := cloneEnvelope(env)
	var p bytes.Buffer
	if err := json.Compact(&p, e.Payload); err != nil || p.Len() == 0 || e.Check() != nil {
		return
	}
	if !bytes.Equal(p.Bytes(), e.Payload) {
		e.Payload = p.Bytes()
	}
	c.put(maphash.Bytes(c.seed, b), b, e)
}

// put records env, which the memo then owns, for the bytes b of hash h.
func (c *envelopeMemo) put(h uint64, b []byte, env envelope) {
	c.mu.Lock()
	if len(c.m) >= memoMax {
		clear(c.m)
	}
	c.m[h] = memoEntry{raw: bytes.Clone(b), env: env}
	c.mu.Unlock()
}

// decode returns decodeEnvelope(b), as a copy the caller may change.
func (c *envelopeMemo) decode(b []byte) (envelope, error) {
	h := maphash.Bytes(c.seed, b)
	c.mu.Lock()
	got, ok := c.m[h]
	c.mu.Unlock()
	if ok && bytes.Equal(got.raw, b) {
		return cloneEnvelope(got.env), nil
	}
	env, err := decodeEnvelope(b)
	if err != nil {
		return env, err
	}
	c.put(h, b, cloneEnvelope(env))
	return env, nil
}
