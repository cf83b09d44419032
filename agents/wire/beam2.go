package wire

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// ProtocolBeam1 and ProtocolBeam2 name the two wire protocols.
const (
	// ProtocolBeam1 is the JavaScript-compatible protocol: Ed25519 signatures over fixed JSON signing strings.
	ProtocolBeam1 = "beam/1"
	// ProtocolBeam2 is the compact-JWS protocol: the frame's JSON is the payload of an EdDSA JWS whose kid is
	// the signer's Beam ID.
	ProtocolBeam2 = "beam/2"
)

// SignIntentJWS returns the beam/2 envelope of f: a compact JWS (typ TypIntentJWS, kid f.From) whose
// payload is f's DeliveryJSON. f needs no beam/1 signature; one that is present stays inside the payload.
func SignIntentJWS(f *IntentFrame, priv ed25519.PrivateKey) (string, error) {
	frame, err := f.DeliveryJSON()
	if err != nil {
		return "", fmt.Errorf("sign intent jws: %w", err)
	}
	return SignJWS(TypIntentJWS, frame, f.From, priv)
}

// SignResultJWS returns the beam/2 envelope of a result frame (its JSON as built by Result.Build): a compact
// JWS with typ TypResultJWS and kid = the recipient that answers.
func SignResultJWS(frame []byte, kid string, priv ed25519.PrivateKey) (string, error) {
	if _, err := DecodeResultFrame(frame); err != nil {
		return "", fmt.Errorf("sign result jws: %w", err)
	}
	return SignJWS(TypResultJWS, frame, kid, priv)
}

// DecodeResultJWS verifies a beam/2 result envelope and decodes the result frame inside it. It returns the
// frame and the kid (the Beam ID that signed it); resolve maps the kid to its key, as for VerifyJWS.
func DecodeResultJWS(token string, resolve func(kid string) (ed25519.PublicKey, error)) (*ResultFrame, string, error) {
	payload, kid, err := VerifyJWS(token, TypResultJWS, resolve)
	if err != nil {
		return nil, kid, err
	}
	r, err := DecodeResultFrame(payload)
	if err != nil {
		return nil, kid, err
	}
	return r, kid, nil
}

// PeekJWSPayload returns the payload of a compact JWS without verifying anything but its outer shape
// (three base64url segments, at most MaxJWSBytes). Use it only to read what a token claims before the
// signer's key is known; the result is untrusted until VerifyJWS succeeds.
func PeekJWSPayload(token string) ([]byte, error) {
	if len(token) > MaxJWSBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds limit %d", ErrJWS, len(token), MaxJWSBytes)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%w: compact serialization needs 3 segments, got %d", ErrJWS, len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("%w: payload segment: %w", ErrJWS, err)
	}
	if len(payload) == 0 {
		return nil, fmt.Errorf("%w: %w", ErrJWS, errors.New("empty payload"))
	}
	return payload, nil
}
