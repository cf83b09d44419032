package wire

import (
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"

	jose "github.com/go-jose/go-jose/v4"
)

const (
	// TypIntentJWS is the "typ" header of a beam/2 intent envelope.
	TypIntentJWS = "beam-intent+jws"
	// TypResultJWS is the "typ" header of a beam/2 result envelope.
	TypResultJWS = "beam-result+jws"
)

// MaxJWSBytes bounds a compact JWS the verifier accepts.
const MaxJWSBytes = 4*MaxFrameBytes/3 + 4096

// ErrJWS is wrapped by every beam/2 envelope verification failure.
var ErrJWS = errors.New("invalid beam/2 envelope")

// SignJWS signs payload (a frame's JSON) as a compact JWS with EdDSA; the protected header carries
// kid (the signer's Beam ID) and typ.
func SignJWS(typ string, payload []byte, kid string, priv ed25519.PrivateKey) (string, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("sign jws: private key is %d bytes", len(priv))
	}
	if kid == "" || typ == "" {
		return "", errors.New("sign jws: kid and typ are required")
	}
	opts := (&jose.SignerOptions{}).WithType(jose.ContentType(typ))
	signer, err := jose.NewSigner(jose.SigningKey{
		Algorithm: jose.EdDSA,
		Key:       jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: string(jose.EdDSA)},
	}, opts)
	if err != nil {
		return "", fmt.Errorf("sign jws: %w", err)
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("sign jws: %w", err)
	}
	token, err := obj.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("sign jws: %w", err)
	}
	return token, nil
}

// VerifyJWS verifies a beam/2 compact JWS: EdDSA only, exactly one signature, a protected kid, typ equal
// to wantTyp, no embedded or referenced keys (jwk, jku, x5u, x5c). resolve maps the kid (a Beam ID) to the
// signer's current public key. It returns the verified payload and the kid. Failures wrap ErrJWS (and
// ErrBadSignature for a bad signature).
func VerifyJWS(token string, wantTyp string, resolve func(kid string) (ed25519.PublicKey, error)) ([]byte, string, error) {
	if len(token) > MaxJWSBytes {
		return nil, "", fmt.Errorf("%w: %d bytes exceeds limit %d", ErrJWS, len(token), MaxJWSBytes)
	}
	obj, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrJWS, err)
	}
	if len(obj.Signatures) != 1 {
		return nil, "", fmt.Errorf("%w: want exactly one signature, got %d", ErrJWS, len(obj.Signatures))
	}
	h := obj.Signatures[0].Protected
	if h.Algorithm != string(jose.EdDSA) {
		return nil, "", fmt.Errorf("%w: algorithm %q is not allowed", ErrJWS, h.Algorithm)
	}
	if h.JSONWebKey != nil {
		return nil, "", fmt.Errorf("%w: embedded jwk is not allowed", ErrJWS)
	}
	for _, k := range []jose.HeaderKey{"jku", "x5u"} {
		if _, ok := h.ExtraHeaders[k]; ok {
			return nil, "", fmt.Errorf("%w: header %q is not allowed", ErrJWS, k)
		}
	}
	if _, err := h.Certificates(x509.VerifyOptions{}); !errors.Is(err, jose.ErrMissingX5cHeader) {
		return nil, "", fmt.Errorf("%w: header \"x5c\" is not allowed", ErrJWS)
	}
	typ, _ := h.ExtraHeaders[jose.HeaderType].(string)
	if typ != wantTyp {
		return nil, "", fmt.Errorf("%w: typ %q, want %q", ErrJWS, typ, wantTyp)
	}
	if h.KeyID == "" {
		return nil, "", fmt.Errorf("%w: missing kid", ErrJWS)
	}
	pub, err := resolve(h.KeyID)
	if err != nil {
		return nil, h.KeyID, fmt.Errorf("%w: resolve kid %q: %w", ErrJWS, h.KeyID, err)
	}
	if len(pub) != ed25519.PublicKeySize {
		return nil, h.KeyID, fmt.Errorf("%w: key for kid %q is not an ed25519 public key", ErrJWS, h.KeyID)
	}
	payload, err := obj.Verify(pub)
	if err != nil {
		return nil, h.KeyID, fmt.Errorf("%w: kid %q: %w: %w", ErrJWS, h.KeyID, ErrBadSignature, err)
	}
	return payload, h.KeyID, nil
}

// DecodeIntentJWS verifies a beam/2 intent envelope and decodes the frame inside it. The kid must equal
// the frame's "from"; the frame's own beam/1 signature, if any, is not checked (the JWS covers it all).
func DecodeIntentJWS(token string, resolve func(kid string) (ed25519.PublicKey, error)) (*IntentFrame, error) {
	payload, kid, err := VerifyJWS(token, TypIntentJWS, resolve)
	if err != nil {
		return nil, err
	}
	f, err := DecodeIntentFrame(payload)
	if err != nil {
		return nil, err
	}
	if f.From != kid {
		return nil, fmt.Errorf("%w: kid %q does not match intent sender %q", ErrJWS, kid, f.From)
	}
	return f, nil
}
