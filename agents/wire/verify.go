package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha512"
	"sync"

	"filippo.io/edwards25519"
)

// keyPointsMax bounds keyPoints; when it is full it starts over.
const keyPointsMax = 4096

// keyPoints holds the decoded points (negated, as the verification uses
// them) of the public keys intents were recently verified with. Decoding a
// key takes a field square root, about 7 % of a verification, and a
// directory verifies every intent of a sender with the same key. A point
// is a function of the key's bytes alone, so an entry never goes stale.
var keyPoints = struct {
	mu sync.Mutex
	m  map[[ed25519.PublicKeySize]byte]*edwards25519.Point
}{m: make(map[[ed25519.PublicKeySize]byte]*edwards25519.Point)}

// negatedKeyPoint returns -A for the public key pub (32 bytes), or false
// when pub is not the encoding of a point.
func negatedKeyPoint(pub []byte) (*edwards25519.Point, bool) {
	k := [ed25519.PublicKeySize]byte(pub)
	keyPoints.mu.Lock()
	p := keyPoints.m[k]
	keyPoints.mu.Unlock()
	if p != nil {
		return p, true
	}
	a, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return nil, false
	}
	p = new(edwards25519.Point).Negate(a)
	keyPoints.mu.Lock()
	if len(keyPoints.m) >= keyPointsMax {
		clear(keyPoints.m)
	}
	keyPoints.m[k] = p
	keyPoints.mu.Unlock()
	return p, true
}

// verifyEd25519 reports whether sig is pub's signature of msg. It decides
// exactly as ed25519.Verify does (RFC 8032 without a cofactor, S below the
// group order, the key decoded as crypto/ed25519 decodes it), but takes the
// key's point from keyPoints instead of decoding the key every time.
// FuzzVerifyEd25519MatchesStdlib holds the two to the same answers.
func verifyEd25519(pub ed25519.PublicKey, msg, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize || sig[63]&224 != 0 {
		return false
	}
	negA, ok := negatedKeyPoint(pub)
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
	r := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(k, negA, s)
	return bytes.Equal(sig[:32], r.Bytes())
}
