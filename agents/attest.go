package agents

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// Attestation. An intent its sender did not sign (sent with an API key,
// the operator bus key, a beam/2 JWS turned into a beam/1 frame, or
// vouched for by a peer directory) arrives signed by the directory's
// attestation key and marked with an "attestation" member. The client
// verifies such a frame against the key the directory publishes at
// wire.AttestationKeysPath — never against whatever key the message names —
// and reports it in Intent.Attested; an unmarked frame must carry its
// sender's own signature, and one signed by an attestation key without the
// mark is dropped.

// Attested says that the directory, not the sender, signed an incoming
// intent, and how it authenticated the sender.
type Attested struct {
	// By is the attesting directory's name (its domain).
	By string
	// KeyID names the attestation key; Key is that key, as the directory
	// publishes it at DirectoryURL + wire.AttestationKeysPath.
	KeyID string
	Key   ed25519.PublicKey
	// Auth is how the directory authenticated the sender: "api_key",
	// "bus_key", "jws" or "peer".
	Auth string
	// VouchedBy is the peer directory that vouched for the sender (Auth
	// "peer").
	VouchedBy string
}

// attestRefetch is the least time between two fetches of the key document
// when an unknown key id arrives.
const attestRefetch = 10 * time.Second

// attestState caches the directory's attestation keys.
type attestState struct {
	// fetchMu serializes attestationKey's fetches, so an intent that
	// arrives while another one's fetch is under way waits for it instead
	// of finding the key neither cached nor due for a fetch.
	fetchMu sync.Mutex
	mu      sync.Mutex
	by      string
	keys    map[string]ed25519.PublicKey
	fetched time.Time // last fetch attempt
}

// AttestationKeys fetches the attestation keys the directory publishes at
// wire.AttestationKeysPath, by key id, and caches them for the
// verification of attested intents.
func (c *Client) AttestationKeys(ctx context.Context) (map[string]ed25519.PublicKey, error) {
	var raw json.RawMessage
	if _, err := c.doJSON(ctx, http.MethodGet, wire.AttestationKeysPath, nil, nil, &raw, false); err != nil {
		return nil, fmt.Errorf("attestation keys: %w", err)
	}
	doc, keys, err := wire.DecodeAttestationKeys(raw)
	if err != nil {
		return nil, err
	}
	c.att.mu.Lock()
	c.att.by, c.att.keys = doc.By, keys
	c.att.mu.Unlock()
	out := make(map[string]ed25519.PublicKey, len(keys))
	for id, k := range keys {
		out[id] = k
	}
	return out, nil
}

// prefetchAttestationKeys loads the key document once the session is up,
// so that a frame signed by an attestation key but not marked attested is
// recognised even before the first attested intent (best effort; attested
// intents fetch it themselves when it is missing). Started by Connect.
func (c *Client) prefetchAttestationKeys() {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if _, err := c.AttestationKeys(ctx); err != nil && c.ctx.Err() == nil {
		c.log.Debug("beam: attestation keys not loaded", "err", err)
	}
}

// cachedAttestationKey returns a cached attestation key.
func (c *Client) cachedAttestationKey(keyID string) (ed25519.PublicKey, bool) {
	c.att.mu.Lock()
	defer c.att.mu.Unlock()
	k, ok := c.att.keys[keyID]
	return k, ok
}

// attestationKey returns the published attestation key keyID, fetching
// the document when the key is not cached (at most every attestRefetch).
func (c *Client) attestationKey(ctx context.Context, keyID string) (ed25519.PublicKey, error) {
	if k, ok := c.cachedAttestationKey(keyID); ok {
		return k, nil
	}
	c.att.fetchMu.Lock()
	defer c.att.fetchMu.Unlock()
	if k, ok := c.cachedAttestationKey(keyID); ok {
		return k, nil
	}
	c.att.mu.Lock()
	recent := !c.att.fetched.IsZero() && time.Since(c.att.fetched) < attestRefetch
	if !recent {
		c.att.fetched = time.Now()
	}
	c.att.mu.Unlock()
	if !recent {
		if _, err := c.AttestationKeys(ctx); err != nil {
			return nil, err
		}
		if k, ok := c.cachedAttestationKey(keyID); ok {
			return k, nil
		}
	}
	return nil, fmt.Errorf("attestation key %.40q is not published by the directory", keyID)
}

// isAttestationKey reports whether pub is one of the directory's cached
// attestation keys.
func (c *Client) isAttestationKey(pub ed25519.PublicKey) bool {
	c.att.mu.Lock()
	defer c.att.mu.Unlock()
	for _, k := range c.att.keys {
		if k.Equal(pub) {
			return true
		}
	}
	return false
}

// verifyAttested checks an attested frame against the directory's
// published key named by the attestation member.
func (c *Client) verifyAttested(f *wire.IntentFrame, env envelope, named ed25519.PublicKey) (*Attested, error) {
	a := env.Attestation
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("intent %q: %w", f.Nonce, err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	key, err := c.attestationKey(ctx, a.KeyID)
	if err != nil {
		return nil, fmt.Errorf("intent %q: %w", f.Nonce, err)
	}
	if !key.Equal(named) {
		return nil, fmt.Errorf("intent %q: senderPublicKey is not the directory's attestation key %s", f.Nonce, a.KeyID)
	}
	if err := wire.VerifyAttested(f, key); err != nil {
		return nil, err
	}
	return &Attested{By: a.By, KeyID: a.KeyID, Key: key, Auth: a.Auth, VouchedBy: a.VouchedBy}, nil
}
