package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha512"
	"encoding/binary"
	"testing"

	"filippo.io/edwards25519"
	"github.com/stretchr/testify/require"
)

// groupOrder is L, the order of the Ed25519 base point, little-endian.
var groupOrder = [32]byte{0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
	0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10}

// oddKeys are key encodings verifiers disagree about: small-order points,
// non-canonical encodings (y ≥ p, or x = 0 with the sign bit set), and
// bytes that encode no point.
var oddKeys = [][32]byte{
	{0x01}, // the identity
	{0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, // y = -1, order 2
	{},               // y = 0, order 4
	{31: 0x80},       // y = 0, x = 0 with the sign bit: no point
	{0x01, 31: 0x80}, // the identity with the sign bit set
	{0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, // y = p: non-canonical 0
	{0xee, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, // y = p+1: non-canonical identity
	{0x02}, // y = 2: no point
	{0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67, 0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac, 0x03, 0x7a}, // order 8
}

// verifyCase builds one (pub, msg, sig) from fuzz input: a valid signature,
// then damaged or replaced as mode says.
func verifyCase(seed, msg []byte, mode uint8, at uint16) (ed25519.PublicKey, []byte, []byte) {
	h := sha512.Sum512(seed)
	key := ed25519.NewKeyFromSeed(h[:32])
	pub := key.Public().(ed25519.PublicKey)
	sig := ed25519.Sign(key, msg)
	switch mode % 7 {
	case 1: // one bit of the signature flipped
		sig[int(at)%512/8] ^= 1 << (at % 8)
	case 2: // one bit of the message flipped
		if len(msg) > 0 {
			msg = append([]byte(nil), msg...)
			msg[int(at)%len(msg)] ^= 1 << (at % 8)
		}
	case 3: // S + L: the same scalar, not canonical
		var carry uint16
		for i := range 32 {
			v := uint16(sig[32+i]) + uint16(groupOrder[i]) + carry
			sig[32+i], carry = byte(v), v>>8
		}
	case 4: // arbitrary key bytes, mostly no point
		pub = ed25519.PublicKey(h[32:])
	case 5: // an odd key, with the signature
		k := oddKeys[int(at)%len(oddKeys)]
		pub = k[:]
	case 6: // an odd key, with R = [S]B, which the cofactorless check accepts for
		// a small-order key whatever the message
		k := oddKeys[int(at)%len(oddKeys)]
		pub = k[:]
		var wide [64]byte
		copy(wide[:], h[32:])
		s, _ := edwards25519.NewScalar().SetUniformBytes(wide[:])
		copy(sig[:32], new(edwards25519.Point).ScalarBaseMult(s).Bytes())
		copy(sig[32:], s.Bytes())
	}
	return pub, msg, sig
}

func FuzzVerifyEd25519MatchesStdlib(f *testing.F) {
	for mode := range uint8(7) {
		for _, at := range []uint16{0, 3, 255, 300, 511} {
			f.Add([]byte("seed"), []byte(`{"v":"1","intent":"x"}`), mode, at)
		}
	}
	f.Add([]byte{}, []byte{}, uint8(6), uint16(0))
	f.Fuzz(func(t *testing.T, seed, msg []byte, mode uint8, at uint16) {
		pub, msg, sig := verifyCase(seed, msg, mode, at)
		want := ed25519.Verify(pub, msg, sig)
		// The first call decodes the key, the next ones take its point
		// from keyPoints, and the keyTableUses-th and later multiply with
		// its table.
		for use := range keyTableUses + 1 {
			require.Equal(t, want, verifyEd25519(pub, msg, sig),
				"mode %d at %d use %d pub %x sig %x", mode%7, at, use, []byte(pub), sig)
		}
	})
}

// TestVerifyEd25519AgreesOnEveryKind checks each kind of case many times,
// and that the kinds meant to verify do (so the comparison is not only of
// refusals), with more distinct keys than keyPoints holds.
func TestVerifyEd25519AgreesOnEveryKind(t *testing.T) {
	t.Parallel()
	accepted := make([]int, 7)
	n := keyPointsMax + 100
	for i := range n {
		var seed [8]byte
		binary.LittleEndian.PutUint64(seed[:], uint64(i))
		mode := uint8(i % 7)
		pub, msg, sig := verifyCase(seed[:], seed[:], mode, uint16(i*31))
		want := ed25519.Verify(pub, msg, sig)
		for use := range keyTableUses + 1 {
			require.Equal(t, want, verifyEd25519(pub, msg, sig), "case %d mode %d use %d", i, mode, use)
		}
		if want {
			accepted[mode]++
		}
	}
	require.Equal(t, (n+6)/7, accepted[0], "every valid signature verifies")
	require.Zero(t, accepted[1]+accepted[2]+accepted[3], "no damaged signature verifies")
	require.Positive(t, accepted[6], "small-order keys accept R = [S]B, as crypto/ed25519 does")

	keyPoints.mu.Lock()
	defer keyPoints.mu.Unlock()
	tables := 0
	for _, e := range keyPoints.m {
		if e.table.Load() != nil {
			tables++
		}
	}
	require.Positive(t, tables, "keys used %d times have tables", keyTableUses)
	require.LessOrEqual(t, keyPoints.tables, keyTablesMax)
}

// combScalar makes a canonical scalar from fuzz input: the bytes themselves
// when they are canonical (so edge values such as 0, L-1 and long runs of
// the digit 8 are reachable), else their reduction.
func combScalar(b []byte) *edwards25519.Scalar {
	if len(b) == 32 {
		if s, err := edwards25519.NewScalar().SetCanonicalBytes(b); err == nil {
			return s
		}
	}
	var wide [64]byte
	copy(wide[:], b)
	s, _ := edwards25519.NewScalar().SetUniformBytes(wide[:])
	return s
}

func FuzzCombMatchesDoubleScalarMult(f *testing.F) {
	lMinus1 := groupOrder
	lMinus1[0]--
	eights := bytes.Repeat([]byte{0x88}, 32)
	eights[31] = 0x08
	for _, a := range [][]byte{make([]byte, 32), {1}, lMinus1[:], eights} {
		for _, b := range [][]byte{make([]byte, 32), lMinus1[:], eights, []byte("b")} {
			f.Add([]byte("point"), a, b, uint8(0))
			f.Add([]byte("point"), a, b, uint8(len(oddKeys)))
		}
	}
	f.Fuzz(func(t *testing.T, seed, ab, bb []byte, odd uint8) {
		// P is [h]B for a hash h of seed, or one of the odd keys that
		// decode (small-order points among them).
		h := sha512.Sum512(seed)
		hs, _ := edwards25519.NewScalar().SetUniformBytes(h[:])
		p := new(edwards25519.Point).ScalarBaseMult(hs)
		if int(odd) < len(oddKeys) {
			q, err := new(edwards25519.Point).SetBytes(oddKeys[odd][:])
			if err != nil {
				return
			}
			p = q
		}
		a, b := combScalar(ab), combScalar(bb)
		for _, s := range []*edwards25519.Scalar{a, b} {
			d := radix16(s.Bytes())
			for i, v := range d {
				require.True(t, v >= -8 && v < 8, "digit %d is %d", i, v)
			}
		}
		want := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(a, p, b)
		got := combDoubleMult(newCombTable(p), a, b)
		require.Equal(t, 1, want.Equal(got), "[a]P + [b]B: a %x b %x P %x", a.Bytes(), b.Bytes(), p.Bytes())
	})
}
