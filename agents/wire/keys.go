package wire

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// maxKeyText bounds the base64 text of an encoded key; Ed25519 SPKI is 60 characters, PKCS#8 64.
const maxKeyText = 4096

// ErrNotEd25519 is returned when a well-formed key is not an Ed25519 key.
var ErrNotEd25519 = errors.New("key is not ed25519")

// decodeStdBase64 decodes standard-alphabet base64, with or without padding.
func decodeStdBase64(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	b, err := base64.RawStdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not standard base64: %w", err)
	}
	return b, nil
}

// ParsePublicKey decodes a public key in the Beam wire form: standard base64 of SPKI DER. Only Ed25519
// keys are accepted; other key types get an error wrapping ErrNotEd25519.
func ParsePublicKey(b64 string) (ed25519.PublicKey, error) {
	if len(b64) > maxKeyText {
		return nil, fmt.Errorf("parse public key: %d characters is too long", len(b64))
	}
	der, err := decodeStdBase64(b64)
	if err != nil {
		return nil, fmt.Errorf("parse public key: %w", err)
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("parse public key: not SPKI DER: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("parse public key: %T: %w (Beam keys must be Ed25519)", k, ErrNotEd25519)
	}
	return pub, nil
}

// EncodePublicKey returns the Beam wire form of a public key: standard base64 of SPKI DER
// (60 characters, starting "MCowBQYDK2VwAyEA").
func EncodePublicKey(pub ed25519.PublicKey) string {
	der := make([]byte, 0, len(spkiPrefix)+ed25519.PublicKeySize)
	der = append(der, spkiPrefix...)
	der = append(der, pub...)
	return base64.StdEncoding.EncodeToString(der)
}

// spkiPrefix is the fixed DER header of an Ed25519 SubjectPublicKeyInfo.
var spkiPrefix = []byte{0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00}

// pkcs8Prefix is the fixed DER header of an Ed25519 PKCS#8 private key (the 32-byte seed follows).
var pkcs8Prefix = []byte{0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20}

// ParsePrivateKey decodes a private key in the Beam wire form: standard base64 of PKCS#8 DER. Only
// Ed25519 keys are accepted.
func ParsePrivateKey(b64 string) (ed25519.PrivateKey, error) {
	if len(b64) > maxKeyText {
		return nil, fmt.Errorf("parse private key: %d characters is too long", len(b64))
	}
	der, err := decodeStdBase64(b64)
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("parse private key: not PKCS#8 DER: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("parse private key: %T: %w (Beam keys must be Ed25519)", k, ErrNotEd25519)
	}
	return priv, nil
}

// EncodePrivateKey returns the Beam wire form of a private key: standard base64 of PKCS#8 DER.
func EncodePrivateKey(priv ed25519.PrivateKey) string {
	der := make([]byte, 0, len(pkcs8Prefix)+ed25519.SeedSize)
	der = append(der, pkcs8Prefix...)
	der = append(der, priv.Seed()...)
	return base64.StdEncoding.EncodeToString(der)
}

// GenerateKey returns a fresh Ed25519 key pair from crypto/rand.
func GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate ed25519 key: %w", err)
	}
	return pub, priv, nil
}

// ErrBadSignature is wrapped by every signature verification failure.
var ErrBadSignature = errors.New("signature verification failed")

// Sign signs msg with Ed25519 and returns the signature in the Beam wire form (standard base64,
// 88 characters).
func Sign(msg []byte, priv ed25519.PrivateKey) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(priv, msg))
}

// decodeSignature decodes a base64 Ed25519 signature and checks its length.
func decodeSignature(sigB64 string) ([]byte, error) {
	if sigB64 == "" {
		return nil, fmt.Errorf("%w: missing signature", ErrBadSignature)
	}
	if len(sigB64) > 256 {
		return nil, fmt.Errorf("%w: signature text too long", ErrBadSignature)
	}
	sig, err := decodeStdBase64(sigB64)
	if err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrBadSignature, err)
	}
	if len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: signature is %d bytes, want %d", ErrBadSignature, len(sig), ed25519.SignatureSize)
	}
	return sig, nil
}

// VerifySignature checks a base64 Ed25519 signature over msg. Failures wrap ErrBadSignature.
func VerifySignature(msg []byte, sigB64 string, pub ed25519.PublicKey) error {
	sig, err := decodeSignature(sigB64)
	if err != nil {
		return err
	}
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: public key is %d bytes", ErrBadSignature, len(pub))
	}
	if !ed25519.Verify(pub, msg, sig) {
		return ErrBadSignature
	}
	return nil
}
