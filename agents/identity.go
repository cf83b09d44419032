package agents

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/beamdir/beam/agents/wire"
)

// maxIdentityFile bounds the size of an identity file LoadIdentity reads.
const maxIdentityFile = 64 << 10

// Identity is an agent's Beam ID and Ed25519 key pair.
type Identity struct {
	// BeamID is the agent's address, e.g. "assistant@acme.beam.directory".
	BeamID string
	// Public is the agent's public key.
	Public ed25519.PublicKey
	// Private is the agent's private key.
	Private ed25519.PrivateKey
	// APIKey is the directory API key ("bk_…") stored with the identity, if
	// any. Register fills it in; Save writes it; the key is a credential.
	APIKey string
}

// identityFile is the stored form of an Identity: the field names of the
// TypeScript SDK's BeamIdentity.export(), keys as base64 SPKI and PKCS#8 DER,
// plus the optional API key.
type identityFile struct {
	BeamID           string `json:"beamId"`
	PublicKeyBase64  string `json:"publicKeyBase64"`
	PrivateKeyBase64 string `json:"privateKeyBase64"`
	APIKey           string `json:"apiKey,omitempty"`
}

// GenerateIdentity makes a fresh key pair for beamID, which must be a valid
// Beam ID.
func GenerateIdentity(beamID string) (*Identity, error) {
	if _, err := wire.ParseBeamID(beamID); err != nil {
		return nil, fmt.Errorf("generate identity: %w", err)
	}
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil, fmt.Errorf("generate identity: %w", err)
	}
	return &Identity{BeamID: beamID, Public: pub, Private: priv}, nil
}

// PublicKeyBase64 returns the public key as base64 SPKI DER, the form the
// directory stores and the TypeScript SDK exports.
func (id *Identity) PublicKeyBase64() string {
	return wire.EncodePublicKey(id.Public)
}

// validate checks that the identity is complete and self-consistent.
func (id *Identity) validate() error {
	if id == nil {
		return errors.New("identity is nil")
	}
	if _, err := wire.ParseBeamID(id.BeamID); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if len(id.Private) != ed25519.PrivateKeySize {
		return errors.New("identity: private key missing or not Ed25519")
	}
	if len(id.Public) != ed25519.PublicKeySize {
		return errors.New("identity: public key missing or not Ed25519")
	}
	if !bytes.Equal(id.Private.Public().(ed25519.PublicKey), id.Public) {
		return errors.New("identity: public key does not match the private key")
	}
	return nil
}

// MarshalJSON encodes the identity as {beamId, publicKeyBase64,
// privateKeyBase64[, apiKey]}, the shape the TypeScript SDK's
// BeamIdentity.fromData() reads.
func (id *Identity) MarshalJSON() ([]byte, error) {
	if err := id.validate(); err != nil {
		return nil, err
	}
	priv := wire.EncodePrivateKey(id.Private)
	return json.Marshal(identityFile{
		BeamID:           id.BeamID,
		PublicKeyBase64:  wire.EncodePublicKey(id.Public),
		PrivateKeyBase64: priv,
		APIKey:           id.APIKey,
	})
}

// UnmarshalJSON decodes the form MarshalJSON writes (and the TypeScript
// SDK's export()), checking that the keys parse and belong together.
func (id *Identity) UnmarshalJSON(b []byte) error {
	var f identityFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	pub, err := wire.ParsePublicKey(f.PublicKeyBase64)
	if err != nil {
		return fmt.Errorf("identity: publicKeyBase64: %w", err)
	}
	priv, err := wire.ParsePrivateKey(f.PrivateKeyBase64)
	if err != nil {
		return fmt.Errorf("identity: privateKeyBase64: %w", err)
	}
	next := Identity{BeamID: f.BeamID, Public: pub, Private: priv, APIKey: f.APIKey}
	if err := next.validate(); err != nil {
		return err
	}
	*id = next
	return nil
}

// Save writes the identity to path with file mode 0600, replacing the file
// atomically (write to a temporary file in the same directory, then rename).
func (id *Identity) Save(path string) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	b = append(b, '\n')
	tmp, err := os.CreateTemp(filepath.Dir(path), ".beam-identity-*")
	if err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("save identity: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("save identity: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save identity: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	return nil
}

// LoadIdentity reads an identity file written by Save or by the TypeScript
// SDK's export(). Unknown fields are ignored.
func LoadIdentity(path string) (*Identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load identity: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIdentityFile+1))
	if err != nil {
		return nil, fmt.Errorf("load identity: %w", err)
	}
	if len(b) > maxIdentityFile {
		return nil, fmt.Errorf("load identity: %s is larger than %d bytes", path, maxIdentityFile)
	}
	var id Identity
	if err := json.Unmarshal(b, &id); err != nil {
		return nil, fmt.Errorf("load identity %s: %w", path, err)
	}
	return &id, nil
}
