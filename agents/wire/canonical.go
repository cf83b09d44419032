package wire

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
)

// SignCanonical signs the CanonicalJSON form of fields with Ed25519 and returns the base64 signature.
// fields is raw JSON ([]byte or json.RawMessage) or any value encoding/json can marshal (for example
// map[string]any{"action": "keys.rotate", "beamId": …, "newPublicKey": …, "timestamp": …}).
func SignCanonical(fields any, priv ed25519.PrivateKey) (string, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("sign canonical: private key is %d bytes", len(priv))
	}
	raw, err := rawJSON(fields)
	if err != nil {
		return "", fmt.Errorf("sign canonical: %w", err)
	}
	msg, err := CanonicalJSON(raw)
	if err != nil {
		return "", fmt.Errorf("sign canonical: %w", err)
	}
	return Sign(msg, priv), nil
}

// VerifyCanonical checks a base64 Ed25519 signature over CanonicalJSON(raw). Failures wrap
// ErrBadSignature.
func VerifyCanonical(raw []byte, sigB64 string, pub ed25519.PublicKey) error {
	msg, err := CanonicalJSON(raw)
	if err != nil {
		return fmt.Errorf("verify canonical: %w: %w", ErrBadSignature, err)
	}
	if err := VerifySignature(msg, sigB64, pub); err != nil {
		return fmt.Errorf("verify canonical: %w", err)
	}
	return nil
}

func rawJSON(v any) ([]byte, error) {
	switch t := v.(type) {
	case []byte:
		return t, nil
	case json.RawMessage:
		return t, nil
	case string:
		return nil, fmt.Errorf("pass raw JSON as []byte, not string")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal fields: %w", err)
	}
	return b, nil
}
