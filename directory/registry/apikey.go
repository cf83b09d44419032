package registry

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// apiKeyPrefix starts every agent API key.
const apiKeyPrefix = "bk_"

// maxAPIKeyLen bounds the keys we are willing to parse.
const maxAPIKeyLen = 512

// newAPIKey mints a key for beamID and returns it with its SHA-256 hex digest.
func newAPIKey(beamID string) (key, hash string, err error) {
	var secret [24]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", "", fmt.Errorf("api key randomness: %w", err)
	}
	key = apiKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte(beamID)) + "." +
		base64.RawURLEncoding.EncodeToString(secret[:])
	return key, hashAPIKey(key), nil
}

func hashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// beamIDFromAPIKey reads the Beam ID embedded in an API key.
func beamIDFromAPIKey(key string) (string, bool) {
	if len(key) > maxAPIKeyLen || !strings.HasPrefix(key, apiKeyPrefix) {
		return "", false
	}
	enc, _, ok := strings.Cut(key[len(apiKeyPrefix):], ".")
	if !ok || enc == "" {
		return "", false
	}
	id, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(id) == 0 {
		return "", false
	}
	return string(id), true
}

// apiKeyMatches compares key with a stored digest in constant time.
func apiKeyMatches(key, storedHash string) bool {
	if storedHash == "" {
		return false
	}
	got := hashAPIKey(key)
	return subtle.ConstantTimeCompare([]byte(got), []byte(storedHash)) == 1
}
