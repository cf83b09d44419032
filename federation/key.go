package federation

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/attest"
)

// KeyFile is the name of the directory key inside the data directory: the
// base64url (unpadded) Ed25519 seed, mode 0600.
const KeyFile = "directory.key"

// LoadOrCreateKey returns the directory key stored in dataDir, generating
// and storing one when the data directory has none. created reports a new
// key. The file format is shared with the attestation key
// (attest.LoadOrCreateKeyFile).
func LoadOrCreateKey(dataDir string) (priv ed25519.PrivateKey, created bool, err error) {
	priv, created, err = attest.LoadOrCreateKeyFile(filepath.Join(dataDir, KeyFile))
	if err != nil {
		return nil, false, fmt.Errorf("directory key: %w", err)
	}
	return priv, created, nil
}

// EncodeKey is the text form of a directory public key in peer lines:
// base64url without padding (43 characters).
func EncodeKey(pub ed25519.PublicKey) string {
	return base64.RawURLEncoding.EncodeToString(pub)
}

// parseKey parses EncodeKey's form.
func parseKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("directory key %q: want 43 characters of unpadded base64url (32 bytes)", truncate(s))
	}
	return ed25519.PublicKey(b), nil
}

// NkeyUser returns the NATS user public key ("U...") of a directory key:
// the same Ed25519 key in nkey encoding, so a directory authenticates to
// NATS with the key its messages are signed with.
func NkeyUser(pub ed25519.PublicKey) (string, error) {
	if len(pub) != ed25519.PublicKeySize {
		return "", fmt.Errorf("nkey: public key is %d bytes", len(pub))
	}
	b, err := nkeys.Encode(nkeys.PrefixByteUser, pub)
	if err != nil {
		return "", fmt.Errorf("nkey: %w", err)
	}
	return string(b), nil
}

// nkeyPair is the NATS user key pair of a directory key.
func nkeyPair(priv ed25519.PrivateKey) (nkeys.KeyPair, error) {
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, priv.Seed())
	if err != nil {
		return nil, fmt.Errorf("nkey from directory key: %w", err)
	}
	return kp, nil
}

// ValidDomain reports whether d is a directory domain: beam.directory or
// <org>.beam.directory, the domains of Beam IDs.
func ValidDomain(d string) error {
	if _, err := wire.ParseBeamID("x@" + d); err != nil {
		return fmt.Errorf("domain %q: want beam.directory or <org>.beam.directory", truncate(d))
	}
	return nil
}

// domainOf returns the directory domain of a Beam ID.
func domainOf(beamID string) (string, error) {
	id, err := wire.ParseBeamID(beamID)
	if err != nil {
		return "", err
	}
	return id.Domain(), nil
}

// Peer is a pinned peer directory.
type Peer struct {
	// Domain is the peer's directory domain, e.g. beta.beam.directory.
	Domain string `json:"domain"`
	// URL is where the peer's NATS server accepts this directory
	// (nats://host:port). With a shared NATS deployment it is informative.
	URL string `json:"url"`
	// PublicKey is the peer's pinned directory key.
	PublicKey ed25519.PublicKey `json:"-"`
	// AddedAt is when the peer was pinned.
	AddedAt time.Time `json:"addedAt"`
	// LastContact is when a verified message from the peer last arrived,
	// or this directory's connection to it was made (its TLS certificate
	// verified against the pinned key); zero: never.
	LastContact time.Time `json:"lastContact,omitzero"`
}

// Line returns the peer line DOMAIN=URL#PUBLICKEY.
func (p Peer) Line() string {
	return p.Domain + "=" + p.URL + "#" + EncodeKey(p.PublicKey)
}

// maxPeerLineBytes bounds a peer line.
const maxPeerLineBytes = 1024

// ParsePeerLine parses DOMAIN=nats://HOST:PORT#PUBLICKEY as printed by
// `beam peer show-self`.
func ParsePeerLine(line string) (Peer, error) {
	line = strings.TrimSpace(line)
	if len(line) > maxPeerLineBytes {
		return Peer{}, fmt.Errorf("peer line: longer than %d bytes", maxPeerLineBytes)
	}
	domain, rest, ok := strings.Cut(line, "=")
	if !ok {
		return Peer{}, fmt.Errorf("peer line %q: want DOMAIN=nats://HOST:PORT#PUBLICKEY", truncate(line))
	}
	if err := ValidDomain(domain); err != nil {
		return Peer{}, fmt.Errorf("peer line: %w", err)
	}
	i := strings.LastIndexByte(rest, '#')
	if i < 0 {
		return Peer{}, fmt.Errorf("peer line %q: missing #PUBLICKEY", truncate(line))
	}
	rawURL, key := rest[:i], rest[i+1:]
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" || u.Path != "" || u.User != nil {
		return Peer{}, fmt.Errorf("peer line %q: want a nats://HOST:PORT URL", truncate(line))
	}
	pub, err := parseKey(key)
	if err != nil {
		return Peer{}, fmt.Errorf("peer line: %w", err)
	}
	return Peer{Domain: domain, URL: rawURL, PublicKey: pub}, nil
}

// SelfLine is the peer line other directories pin for this one.
func SelfLine(domain, natsAddr string, pub ed25519.PublicKey) string {
	return Peer{Domain: domain, URL: "nats://" + natsAddr, PublicKey: pub}.Line()
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// ShareKey creates the directory key in dirs[0] if it has none and copies
// it into the other data directories: the nodes of one cluster present one
// directory identity.
func ShareKey(dirs []string) error {
	if len(dirs) == 0 {
		return errors.New("share directory key: no data directory")
	}
	if _, _, err := LoadOrCreateKey(dirs[0]); err != nil {
		return fmt.Errorf("share directory key: %w", err)
	}
	key, err := os.ReadFile(filepath.Join(dirs[0], KeyFile))
	if err != nil {
		return fmt.Errorf("share directory key: %w", err)
	}
	for _, d := range dirs[1:] {
		if err := os.WriteFile(filepath.Join(d, KeyFile), key, 0o600); err != nil {
			return fmt.Errorf("share directory key: %w", err)
		}
	}
	return nil
}
