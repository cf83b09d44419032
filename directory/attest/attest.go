package attest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/beamdir/beam/agents/wire"
)

// KeyFile is the name of the attestation key inside the data directory.
const KeyFile = "attestation.key"

// Attester signs frames on behalf of senders the directory authenticated.
// It is safe for concurrent use.
type Attester struct {
	priv   ed25519.PrivateKey
	pubB64 string
	keyID  string
	by     string
	doc    []byte
}

// newAttester returns an Attester for priv; by names the directory in every
// attestation (its domain).
func newAttester(priv ed25519.PrivateKey, by string) (*Attester, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("attester: private key is %d bytes", len(priv))
	}
	pub := priv.Public().(ed25519.PublicKey)
	a := &Attester{priv: priv, pubB64: wire.EncodePublicKey(pub), keyID: wire.AttestationKeyID(pub), by: by}
	doc, err := json.Marshal(wire.AttestationKeys{By: by, Keys: []wire.AttestationKey{
		{KeyID: a.keyID, PublicKey: a.pubB64, Algorithm: "Ed25519"},
	}})
	if err != nil {
		return nil, fmt.Errorf("attester: encode key document: %w", err)
	}
	a.doc = doc
	return a, nil
}

// Ephemeral returns an Attester with a fresh key that lives only in
// memory (a directory built without a data directory, e.g. in tests).
func Ephemeral(by string) (*Attester, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("attester: generate key: %w", err)
	}
	return newAttester(priv, by)
}

// LoadOrCreate returns the Attester of the key in dataDir/KeyFile,
// creating the key on first start.
func LoadOrCreate(dataDir, by string) (*Attester, error) {
	priv, _, err := LoadOrCreateKeyFile(filepath.Join(dataDir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("attestation key: %w", err)
	}
	return newAttester(priv, by)
}

// PublicKey returns the attestation key in the Beam wire form, as it is
// delivered in senderPublicKey.
func (a *Attester) PublicKey() string { return a.pubB64 }

// KeyID returns wire.AttestationKeyID of the key.
func (a *Attester) KeyID() string { return a.keyID }

// Member returns the attestation member for a sender authenticated by
// auth (one of the wire.Attest* constants); vouchedBy names the peer
// directory for wire.AttestPeer.
func (a *Attester) Member(auth, vouchedBy string) wire.Attestation {
	return wire.Attestation{By: a.by, KeyID: a.keyID, Auth: auth, VouchedBy: vouchedBy}
}

// Details returns the member as trace details (details.attestation of the
// event that hands the frame over).
func (a *Attester) Details(auth, vouchedBy string) map[string]any {
	d := map[string]any{"by": a.by, "keyId": a.keyID, "auth": auth}
	if vouchedBy != "" {
		d["vouchedBy"] = vouchedBy
	}
	return d
}

// Attest returns a copy of the unsigned frame f signed by the attestation
// key, and its attestation member. f itself is not changed; a frame that
// already carries a signature is refused (a sender signature travels
// verbatim, never replaced).
func (a *Attester) Attest(f *wire.IntentFrame, auth, vouchedBy string) (*wire.IntentFrame, wire.Attestation, error) {
	if f.Signature != "" {
		return nil, wire.Attestation{}, errors.New("attest: the frame carries its sender's signature")
	}
	g := *f
	if err := wire.AttestIntent(&g, a.priv); err != nil {
		return nil, wire.Attestation{}, fmt.Errorf("attest %s: %w", f.Nonce, err)
	}
	return &g, a.Member(auth, vouchedBy), nil
}

// ServeHTTP serves the wire.AttestationKeys document (mount it at
// wire.AttestationKeysPath).
func (a *Attester) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(a.doc)
}

// LoadOrCreateKeyFile returns the Ed25519 key stored at path (the
// unpadded base64url seed, one line), generating and storing one (mode
// 0600) when the file does not exist. created reports a new key. Two
// processes racing to create it end up with the same key.
func LoadOrCreateKeyFile(path string) (priv ed25519.PrivateKey, created bool, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("create data directory: %w", err)
	}
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		seed, derr := base64.RawURLEncoding.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(seed) != ed25519.SeedSize {
			return nil, false, fmt.Errorf("%s: not a base64url Ed25519 seed", path)
		}
		return ed25519.NewKeyFromSeed(seed), false, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, false, fmt.Errorf("generate: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			// Another process created it first: use theirs.
			return LoadOrCreateKeyFile(path)
		}
		return nil, false, fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.WriteString(base64.RawURLEncoding.EncodeToString(seed) + "\n"); err != nil {
		_ = f.Close()
		return nil, false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return nil, false, fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, false, fmt.Errorf("close %s: %w", path, err)
	}
	return ed25519.NewKeyFromSeed(seed), true, nil
}
