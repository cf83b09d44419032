package wire

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
)

// BeamDomain is the fixed namespace every Beam ID lives under.
const BeamDomain = "beam.directory"

// maxLabel is the longest agent or organisation label (the did:beam ABNF allows 1–63 characters).
const maxLabel = 63

// BeamID identifies an agent: agent@org.beam.directory, or agent@beam.directory for a personal agent
// (Org is then empty).
type BeamID struct {
	Agent string
	Org   string
}

// ErrInvalidBeamID is wrapped by every Beam ID and DID parse error.
var ErrInvalidBeamID = errors.New("invalid beam id")

func validLabel(s string) bool {
	if len(s) == 0 || len(s) > maxLabel {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ParseBeamID parses agent@beam.directory or agent@org.beam.directory. Only lowercase letters, digits,
// '_' and '-' are allowed, 1–63 characters per label, exactly as the directory's
// ^[a-z0-9_-]+@(?:[a-z0-9_-]+\.)?beam\.directory$ plus the length bound.
func ParseBeamID(s string) (BeamID, error) {
	agent, domain, ok := strings.Cut(s, "@")
	if !ok {
		return BeamID{}, fmt.Errorf("%w %q: missing '@'", ErrInvalidBeamID, s)
	}
	if !validLabel(agent) {
		return BeamID{}, fmt.Errorf("%w %q: agent name must be 1-63 of [a-z0-9_-]", ErrInvalidBeamID, s)
	}
	if domain == BeamDomain {
		return BeamID{Agent: agent}, nil
	}
	org, ok := strings.CutSuffix(domain, "."+BeamDomain)
	if !ok || !validLabel(org) {
		return BeamID{}, fmt.Errorf("%w %q: domain must be beam.directory or <org>.beam.directory with org 1-63 of [a-z0-9_-]", ErrInvalidBeamID, s)
	}
	return BeamID{Agent: agent, Org: org}, nil
}

// String returns the Beam ID in its wire form.
func (id BeamID) String() string {
	return id.Agent + "@" + id.Domain()
}

// Personal reports whether the ID is a personal agent (agent@beam.directory).
func (id BeamID) Personal() bool { return id.Org == "" }

// Domain returns "org.beam.directory", or "beam.directory" for a personal agent.
func (id BeamID) Domain() string {
	if id.Org == "" {
		return BeamDomain
	}
	return id.Org + "." + BeamDomain
}

// DID returns did:beam:org:agent, or did:beam:agent for a personal agent.
func (id BeamID) DID() string {
	if id.Org == "" {
		return "did:beam:" + id.Agent
	}
	return "did:beam:" + id.Org + ":" + id.Agent
}

const didPrefix = "did:beam:"

// ParseDID parses the name forms of did:beam (did:beam:org:agent and did:beam:agent) into a Beam ID.
// A key-based DID (did:beam:z6Mk…) is an error here; use ParseKeyDID.
func ParseDID(did string) (BeamID, error) {
	rest, ok := strings.CutPrefix(did, didPrefix)
	if !ok {
		return BeamID{}, fmt.Errorf("%w: %q is not a did:beam identifier", ErrInvalidBeamID, did)
	}
	first, second, two := strings.Cut(rest, ":")
	if !two {
		if strings.HasPrefix(rest, "z") && !validLabel(rest) {
			return BeamID{}, fmt.Errorf("%w: %q is a key-based DID, not a name", ErrInvalidBeamID, did)
		}
		if !validLabel(rest) {
			return BeamID{}, fmt.Errorf("%w: %q: agent name must be 1-63 of [a-z0-9_-]", ErrInvalidBeamID, did)
		}
		return BeamID{Agent: rest}, nil
	}
	if !validLabel(first) || !validLabel(second) {
		return BeamID{}, fmt.Errorf("%w: %q: expected did:beam:<org>:<agent> with labels of 1-63 [a-z0-9_-]", ErrInvalidBeamID, did)
	}
	return BeamID{Agent: second, Org: first}, nil
}

// multicodecEd25519 is the multicodec prefix of an Ed25519 public key (0xed as unsigned varint).
var multicodecEd25519 = [2]byte{0xed, 0x01}

// Multibase returns the base58btc multibase ("z…") form of 0xed01 followed by the raw public key, as
// used in publicKeyMultibase and key-based DIDs.
func Multibase(pub ed25519.PublicKey) string {
	buf := make([]byte, 0, 2+len(pub))
	buf = append(buf, multicodecEd25519[:]...)
	buf = append(buf, pub...)
	return "z" + base58Encode(buf)
}

// KeyDID returns the key-based DID did:beam:z6Mk… of a public key.
func KeyDID(pub ed25519.PublicKey) string {
	return didPrefix + Multibase(pub)
}

// ParseMultibase decodes a "z…" Ed25519 multibase value back into the public key.
func ParseMultibase(s string) (ed25519.PublicKey, error) {
	rest, ok := strings.CutPrefix(s, "z")
	if !ok {
		return nil, fmt.Errorf("multibase %q: only base58btc ('z') is supported", s)
	}
	if len(rest) > 64 {
		return nil, fmt.Errorf("multibase %q: too long for an ed25519 key", s)
	}
	b, err := base58Decode(rest)
	if err != nil {
		return nil, fmt.Errorf("multibase %q: %w", s, err)
	}
	if len(b) != 2+ed25519.PublicKeySize || b[0] != multicodecEd25519[0] || b[1] != multicodecEd25519[1] {
		return nil, fmt.Errorf("multibase %q: not an ed25519-pub multicodec key", s)
	}
	return ed25519.PublicKey(b[2:]), nil
}

// ParseKeyDID decodes a key-based DID (did:beam:z6Mk…) into its public key.
func ParseKeyDID(did string) (ed25519.PublicKey, error) {
	rest, ok := strings.CutPrefix(did, didPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a did:beam identifier", ErrInvalidBeamID, did)
	}
	pub, err := ParseMultibase(rest)
	if err != nil {
		return nil, fmt.Errorf("key did: %w", err)
	}
	return pub, nil
}

const base58Alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

// base58Encode encodes b in the Bitcoin base58 alphabet; each leading zero byte becomes a '1'.
func base58Encode(b []byte) string {
	zeros := 0
	for zeros < len(b) && b[zeros] == 0 {
		zeros++
	}
	// Repeated division of the big-endian number by 58, digits collected least significant first.
	num := append([]byte(nil), b[zeros:]...)
	out := make([]byte, 0, len(b)*138/100+1)
	for len(num) > 0 {
		var rem int
		q := num[:0]
		for _, d := range num {
			acc := rem*256 + int(d)
			if digit := acc / 58; digit > 0 || len(q) > 0 {
				q = append(q, byte(digit))
			}
			rem = acc % 58
		}
		out = append(out, base58Alphabet[rem])
		num = q
	}
	for i := 0; i < zeros; i++ {
		out = append(out, '1')
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return string(out)
}

// base58Decode reverses base58Encode.
func base58Decode(s string) ([]byte, error) {
	zeros := 0
	for zeros < len(s) && s[zeros] == '1' {
		zeros++
	}
	var num []byte // big-endian
	for i := zeros; i < len(s); i++ {
		v := strings.IndexByte(base58Alphabet, s[i])
		if v < 0 {
			return nil, fmt.Errorf("invalid base58 character %q", s[i])
		}
		carry := v
		for j := len(num) - 1; j >= 0; j-- {
			acc := int(num[j])*58 + carry
			num[j] = byte(acc)
			carry = acc >> 8
		}
		for carry > 0 {
			num = append([]byte{byte(carry)}, num...)
			carry >>= 8
		}
	}
	return append(make([]byte, zeros), num...), nil
}
