package wire

import (
	"sync"

	"filippo.io/edwards25519"
)

// A verification computes R = [k](-A) + [S]B, two 253-bit scalar
// multiplications. edwards25519's VarTimeDoubleScalarBaseMult shares one
// chain of 253 doublings between them. When the same key verifies many
// signatures, a table of multiples of -A, made once, removes most of those
// doublings: write each scalar in 64 signed base-16 digits d_i in [-8, 8),
// so that [k]P = Σ d_i·16^i·P, and keep (1..8)·16^(4r)·P for r = 0..15.
// Digit i = 4r + j then reads row r, and
//
//	[k]P = Σ_{j=0..3} 16^j · Σ_{r=0..15} d_{4r+j} · row_r
//
// which Horner's rule evaluates with 12 doublings and at most 64 additions
// per scalar. Both scalars share the doublings, B's table is made once per
// process, and the result is the same group element (hence the same
// encoding) as the double-scalar multiplication's: combDoubleMult is held
// to it by FuzzCombMatchesDoubleScalarMult, and verifyEd25519 to
// crypto/ed25519 by FuzzVerifyEd25519MatchesStdlib.
//
// A table is combRows·combDigit points of 160 bytes: 20 KB.
const (
	combGroups = 4               // digits d_{4r+j}, j < combGroups, share row r
	combRows   = 64 / combGroups // rows of a table
	combDigit  = 8               // multiples per row: 1..8 (a digit's sign is a negation)
	combShift  = 4 * combGroups  // bits between two rows: row r+1 = 2^combShift · row r
)

// combTable holds (m+1)·16^(combGroups·r)·P in t[r][m] for one point P.
type combTable struct {
	t [combRows][combDigit]edwards25519.Point
}

// newCombTable makes P's table: 16·8 points, about 1.5 verifications' work.
func newCombTable(p *edwards25519.Point) *combTable {
	t := new(combTable)
	base := new(edwards25519.Point).Set(p)
	for r := range combRows {
		t.t[r][0].Set(base)
		for m := 1; m < combDigit; m++ {
			t.t[r][m].Add(&t.t[r][m-1], base)
		}
		if r == combRows-1 {
			break
		}
		for range combShift {
			base.Add(base, base)
		}
	}
	return t
}

// baseTable is the table of the base point B.
var baseTable = sync.OnceValue(func() *combTable {
	return newCombTable(edwards25519.NewGeneratorPoint())
})

// radix16 returns the signed base-16 digits of a canonical scalar (little
// endian bytes, below 2^253): s = Σ d_i·16^i with d_i in [-8, 8).
func radix16(s []byte) [64]int8 {
	var d [64]int8
	for i := range 32 {
		d[2*i] = int8(s[i] & 15)
		d[2*i+1] = int8(s[i] >> 4)
	}
	for i := range 63 {
		carry := (d[i] + 8) >> 4
		d[i] -= carry << 4
		d[i+1] += carry
	}
	return d
}

// addDigit adds d·row r of t to acc.
func (t *combTable) addDigit(acc *edwards25519.Point, r int, d int8) {
	switch {
	case d > 0:
		acc.Add(acc, &t.t[r][d-1])
	case d < 0:
		acc.Subtract(acc, &t.t[r][-d-1])
	}
}

// combDoubleMult returns [a]P + [b]B, where t is P's table. It takes
// variable time, which verification (public inputs only) allows.
func combDoubleMult(t *combTable, a, b *edwards25519.Scalar) *edwards25519.Point {
	ad, bd := radix16(a.Bytes()), radix16(b.Bytes())
	bt := baseTable()
	acc := edwards25519.NewIdentityPoint()
	for j := combGroups - 1; j >= 0; j-- {
		if j != combGroups-1 {
			for range 4 {
				acc.Add(acc, acc)
			}
		}
		for r := range combRows {
			i := r*combGroups + j
			t.addDigit(acc, r, ad[i])
			bt.addDigit(acc, r, bd[i])
		}
	}
	return acc
}
