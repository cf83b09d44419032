package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha512"
	"sync"
	"sync/atomic"

	"filippo.io/edwards25519"
)

// keyPointsMax bounds keyPoints; when it is full it starts over.
const keyPointsMax = 4096

// keyTablesMax bounds the keys in keyPoints that have a combTable (20 KB
// each, so at most 20 MiB), and keyTableUses is the verification with a
// key that makes its table: a table costs about 1.5 verifications and
// saves about a third of each one after it.
const (
	keyTablesMax = 1024
	keyTableUses = 3
)

// keyPoint is what keyPoints keeps for a public key: the decoded point,
// negated as the verification uses it, and, once the key has verified
// keyTableUses signatures, the table of that point.
type keyPoint struct {
	negA  edwards25519.Point
	uses  atomic.Uint32
	table atomic.Pointer[combTable]
}

// keyPoints holds the decoded points of the public keys intents were
// recently verified with. Decoding a key takes a field square root, about
// 7 % of a verification, and a directory verifies every intent of a sender
// with the same key. A point is a function of the key's bytes alone, so an
// entry never goes stale.
var keyPoints = struct {
	mu     sync.Mutex
	m      map[[ed25519.PublicKeySize]byte]*keyPoint
	tables int // entries of m with a table (or one being made)
}{m: make(map[[ed25519.PublicKeySize]byte]*keyPoint)}

// keyPointOf returns the entry of the public key pub (32 bytes), or false
// when pub is not the encoding of a point.
func keyPointOf(pub []byte) (*keyPoint, bool) {
	k := [ed25519.PublicKeySize]byte(pub)
	keyPoints.mu.Lock()
	e := keyPoints.m[k]
	keyPoints.mu.Unlock()
	if e != nil {
		return e, true
	}
	a, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return nil, false
	}
	e = new(keyPoint)
	e.negA.Negate(a)
	keyPoints.mu.Lock()
	if len(keyPoints.m) >= keyPointsMax {
		clear(keyPoints.m)
		keyPoints.tables = 0
	}
	keyPoints.m[k] = e
	keyPoints.mu.Unlock()
	return e, true
}

// mayMakeTable reports whether a table may be made for one more key, and
// counts it if so.
func mayMakeTable() bool {
	keyPoints.mu.Lock()
	defer keyPoints.mu.Unlock()
	if keyPoints.tables >= keyTablesMax {
		return false
	}
	keyPoints.tables++
	return true
}

// mult returns R = [k](-A) + [s]B, with the key's table when it has one.
func (e *keyPoint) mult(k, s *edwards25519.Scalar) *edwards25519.Point {
	if t := e.table.Load(); t != nil {
		return combDoubleMult(t, k, s)
	}
	if e.uses.Add(1) == keyTableUses && mayMakeTable() {
		t := newCombTable(&e.negA)
		e.table.Store(t)
		return combDoubleMult(t, k, s)
	}
	return new(edwards25519.Point).VarTimeDoubleScalarBaseMult(k, &e.negA, s)
}

// verifyEd25519 reports whether sig is pub's signature of msg. It decides
// exactly as ed25519.Verify does (RFC 8032 without a cofactor, S below the
// group order, the key decoded as crypto/ed25519 decodes it), but takes the
// key's point from keyPoints instead of decoding the key every time, and
// multiplies with the key's table once it has one (comb.go).
// FuzzVerifyEd25519MatchesStdlib holds the two to the same answers.
func verifyEd25519(pub ed25519.PublicKey, msg, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize || sig[63]&224 != 0 {
		return false
	}
	e, ok := keyPointOf(pub)
	if !ok {
		return false
	}
	h := sha512.New()
	h.Write(sig[:32])
	h.Write(pub)
	h.Write(msg)
	var digest [sha512.Size]byte
	k, err := edwards25519.NewScalar().SetUniformBytes(h.Sum(digest[:0]))
	if err != nil {
		return false // cannot happen: the digest is 64 bytes
	}
	s, err := edwards25519.NewScalar().SetCanonicalBytes(sig[32:])
	if err != nil {
		return false
	}
	// [S]B = R + [k]A  <=>  R = [k](-A) + [S]B
	return bytes.Equal(sig[:32], e.mult(k, s).Bytes())
}
