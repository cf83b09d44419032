package wire

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Attestation: a frame its sender did not sign (sent with an API key, the
// operator bus key, a beam/2 JWS the recipient cannot read, or vouched for
// by a peer directory) is delivered signed by the directory's attestation
// key over the ordinary beam/1 signing string, with that key as
// senderPublicKey and an "attestation" member beside the frame:
//
//	{"type":"intent","frame":{…,"signature":"<by the attestation key>"},
//	 "senderPublicKey":"<attestation key>",
//	 "attestation":{"by":"acme.beam.directory","keyId":"…","auth":"api_key"}}
//
// A receiver that only checks the signature against senderPublicKey (SDK
// 0.5.1) accepts it; a receiver that knows the directory's published keys
// (AttestationKeysPath) checks the signature against the key named by
// keyId and knows that the directory, not the sender, signed it.

// AttestationKeysPath is the well-known route at which a directory
// publishes its attestation keys (an AttestationKeys document).
const AttestationKeysPath = "/.well-known/beam-attestation"

// Ways a directory authenticated the sender of an attested frame
// (Attestation.Auth).
const (
	AttestAPIKey = "api_key" // the sender's API key (bus send, API-key session)
	AttestBusKey = "bus_key" // the operator bus key or operator token, for a local agent
	AttestJWS    = "jws"     // a beam/2 JWS, delivered to a receiver as a beam/1 frame
	AttestPeer   = "peer"    // a pinned peer directory vouched for its own agent
)

// Attestation is the "attestation" member of an intent message whose frame
// the directory signed on the sender's behalf.
type Attestation struct {
	// By names the attesting directory (its domain).
	By string `json:"by"`
	// KeyID names the attestation key that signed the frame (AttestationKeyID).
	KeyID string `json:"keyId"`
	// Auth is how the directory authenticated the sender: AttestAPIKey,
	// AttestBusKey, AttestJWS or AttestPeer.
	Auth string `json:"auth"`
	// VouchedBy is the peer directory that vouched for the sender (Auth
	// AttestPeer).
	VouchedBy string `json:"vouchedBy,omitempty"`
}

// Validate checks that a received attestation member is complete.
func (a *Attestation) Validate() error {
	if a == nil {
		return errors.New("attestation: missing")
	}
	if a.KeyID == "" || len(a.KeyID) > 64 {
		return errors.New("attestation: keyId must be 1-64 characters")
	}
	if len(a.By) > 256 || len(a.VouchedBy) > 256 {
		return errors.New("attestation: by and vouchedBy must be at most 256 characters")
	}
	switch a.Auth {
	case AttestAPIKey, AttestBusKey, AttestJWS, AttestPeer:
	default:
		return fmt.Errorf("attestation: unknown auth %.40q", a.Auth)
	}
	return nil
}

// AttestationKeyID returns the identifier of an attestation key: the
// unpadded base64url of the first 16 bytes of SHA-256 over the raw key
// (22 characters).
func AttestationKeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// AttestIntent signs f with the attestation key priv over its SigningInput
// and sets f.Signature. f must not carry a sender signature: an attested
// frame replaces none.
func AttestIntent(f *IntentFrame, priv ed25519.PrivateKey) error {
	if f.Signature != "" {
		return errors.New("attest intent: the frame is signed by its sender")
	}
	return SignIntent(f, priv)
}

// VerifyAttested checks an attested frame's signature against the
// attestation key pub. Only the exact SigningInput is accepted (the
// directory produced it), none of the alternate forms Verify allows for
// sender signatures.
func VerifyAttested(f *IntentFrame, pub ed25519.PublicKey) error {
	sig, err := decodeSignature(f.Signature)
	if err != nil {
		return fmt.Errorf("attested intent %q: %w", f.Nonce, err)
	}
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("attested intent %q: %w: public key is %d bytes", f.Nonce, ErrBadSignature, len(pub))
	}
	msg, err := f.SigningInput()
	if err != nil {
		return fmt.Errorf("attested intent %q: %w: %w", f.Nonce, ErrBadSignature, err)
	}
	if !ed25519.Verify(pub, msg, sig) {
		return fmt.Errorf("attested intent %q from %q: %w", f.Nonce, f.From, ErrBadSignature)
	}
	return nil
}

// SignedDeliverySize is DeliverySize of f once it carries a signature: an
// unsigned frame (to be attested) is measured with a signature of the
// length every Ed25519 signature has (88 base64 characters).
func (f *IntentFrame) SignedDeliverySize() (int, error) {
	if f.Signature != "" {
		return f.DeliverySize()
	}
	g := *f
	g.Signature = strings.Repeat("A", 86) + "=="
	return g.DeliverySize()
}

// AttestationKey is one key of an AttestationKeys document.
type AttestationKey struct {
	// KeyID is AttestationKeyID of the key.
	KeyID string `json:"keyId"`
	// PublicKey is the key in the Beam wire form (base64 SPKI DER).
	PublicKey string `json:"publicKey"`
	// Algorithm is always "Ed25519".
	Algorithm string `json:"algorithm"`
}

// AttestationKeys is the document a directory serves at
// AttestationKeysPath.
type AttestationKeys struct {
	// By is the directory's name as it appears in Attestation.By.
	By string `json:"by"`
	// Keys are the keys attested frames may be signed with.
	Keys []AttestationKey `json:"keys"`
}

// maxAttestationKeys bounds the keys a document may list.
const maxAttestationKeys = 16

// DecodeAttestationKeys parses an AttestationKeys document and returns its
// keys by KeyID. Every key must be Ed25519 and its KeyID must match it.
func DecodeAttestationKeys(data []byte) (*AttestationKeys, map[string]ed25519.PublicKey, error) {
	var doc AttestationKeys
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("attestation keys: %w", err)
	}
	if len(doc.Keys) == 0 || len(doc.Keys) > maxAttestationKeys {
		return nil, nil, fmt.Errorf("attestation keys: want 1-%d keys, got %d", maxAttestationKeys, len(doc.Keys))
	}
	keys := make(map[string]ed25519.PublicKey, len(doc.Keys))
	for i, k := range doc.Keys {
		if k.Algorithm != "Ed25519" {
			return nil, nil, fmt.Errorf("attestation keys: key %d: algorithm %.20q, want Ed25519", i, k.Algorithm)
		}
		pub, err := ParsePublicKey(k.PublicKey)
		if err != nil {
			return nil, nil, fmt.Errorf("attestation keys: key %d: %w", i, err)
		}
		if AttestationKeyID(pub) != k.KeyID {
			return nil, nil, fmt.Errorf("attestation keys: key %d: keyId %.40q does not name its key", i, k.KeyID)
		}
		keys[k.KeyID] = pub
	}
	return &doc, keys, nil
}
