package registry

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRegisterResponseShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := newIdentity(t)
	r := b.call("POST", "/agents/register", map[string]any{
		"beamId": "Alice@Acme.beam.directory", "displayName": "Alice", "capabilities": []string{"chat", "search"},
		"publicKey": id.pubB64, "org": "acme", "email": "alice@example.com",
		// Trust fields from the client must be ignored.
		"verificationTier": "enterprise", "emailVerified": true, "verified": true, "trustScore": 1,
	})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	for _, k := range []string{"beam_id", "beamId"} {
		require.Equal(t, "alice@acme.beam.directory", r.body[k])
	}
	for _, k := range []string{"display_name", "displayName"} {
		require.Equal(t, "Alice", r.body[k])
	}
	for _, k := range []string{"public_key", "publicKey"} {
		require.Equal(t, id.pubB64, r.body[k])
	}
	require.Equal(t, "acme", r.body["org"])
	require.Equal(t, false, r.body["personal"])
	require.Equal(t, []any{"chat", "search"}, r.body["capabilities"])
	require.Equal(t, "did:beam:acme:alice", r.body["did"])
	require.Equal(t, "basic", r.body["verificationTier"])
	require.Equal(t, "basic", r.body["verification_tier"])
	require.Equal(t, false, r.body["verified"])
	require.Equal(t, false, r.body["email_verified"])
	require.Equal(t, "alice@example.com", r.body["email"])
	require.InDelta(t, 0.5, r.body["trust_score"], 1e-9) // base 0.3 + seen within 24 h
	require.InDelta(t, 0.5, r.body["trustScore"], 1e-9)
	require.Equal(t, "2026-05-01T12:00:00.000Z", r.body["created_at"])
	require.Equal(t, "2026-05-01T12:00:00.000Z", r.body["createdAt"])
	require.Equal(t, "2026-05-01T12:00:00.000Z", r.body["last_seen"])
	require.Equal(t, "2026-05-01T12:00:00.000Z", r.body["lastSeen"])
	ks := r.body["keyState"].(map[string]any)
	require.EqualValues(t, 1, ks["total"])
	require.Equal(t, id.pubB64, ks["active"].(map[string]any)["publicKey"])

	apiKey := r.str("apiKey")
	require.True(t, strings.HasPrefix(apiKey, "bk_"), apiKey)
	got, ok := beamIDFromAPIKey(apiKey)
	require.True(t, ok)
	require.Equal(t, "alice@acme.beam.directory", got)

	// Only the hash is stored.
	sum := sha256.Sum256([]byte(apiKey))
	require.Equal(t, hex.EncodeToString(sum[:]), b.dbString(`SELECT api_key_hash FROM agents WHERE beam_id = ?`, "alice@acme.beam.directory"))
	require.Zero(t, b.dbInt(`SELECT COUNT(*) FROM agents WHERE api_key_hash = ? OR public_key = ?`, apiKey, apiKey))
	require.Equal(t, "basic", b.dbString(`SELECT verification_tier FROM agents`))
	require.Zero(t, b.dbInt(`SELECT email_verified + verified FROM agents`))
	require.EqualValues(t, 1, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'agent.register' AND target = ?`, "alice@acme.beam.directory"))
	require.EqualValues(t, 1, b.dbInt(`SELECT COUNT(*) FROM agent_keys WHERE beam_id = ? AND revoked_at IS NULL`, "alice@acme.beam.directory"))

	a, ok := b.reg.AuthenticateAPIKey(apiKey)
	require.True(t, ok)
	require.Equal(t, "alice@acme.beam.directory", a.BeamID)
	require.Equal(t, id.pub, a.PublicKey)
	_, ok = b.reg.AuthenticateAPIKey(apiKey[:len(apiKey)-2] + "AA")
	require.False(t, ok)
	require.Equal(t, 1, b.reg.Count())
	total, verified := b.reg.Stats()
	require.Equal(t, 1, total)
	require.Zero(t, verified)
}

func TestRegisterSnakeCaseAndDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := newIdentity(t)
	r := b.call("POST", "/agents/register", map[string]any{
		"beam_id": "bob@beam.directory", "display_name": "Bob", "public_key": id.pubB64,
		"logo_url": "https://example.com/logo.png", "http_endpoint": "https://bob.example.com/beam",
		"dh_public_key": base64.StdEncoding.EncodeToString(make([]byte, 32)), "unknownField": map[string]any{"x": 1},
	})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	require.Equal(t, "bob@beam.directory", r.body["beamId"])
	require.Equal(t, "personal", r.body["org"])
	require.Equal(t, true, r.body["personal"])
	require.Equal(t, "did:beam:bob", r.body["did"])
	require.Equal(t, []any{}, r.body["capabilities"])
	require.Equal(t, "https://example.com/logo.png", r.body["logo_url"])
	require.Equal(t, "https://bob.example.com/beam", r.body["http_endpoint"])
	require.Equal(t, "public", r.body["visibility"])
	a, ok := b.reg.Get("bob@beam.directory")
	require.True(t, ok)
	require.Equal(t, "https://bob.example.com/beam", a.HTTPEndpoint)
}

func TestRegisterGeneratesBeamIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := []string{}
	for i := 0; i < 3; i++ {
		r := b.call("POST", "/agents/register", map[string]any{
			"displayName": "My Cool Agent!", "publicKey": newIdentity(t).pubB64, "org": "acme"})
		require.Equal(t, http.StatusCreated, r.status, string(r.raw))
		ids = append(ids, r.str("beamId"))
	}
	require.Equal(t, []string{"my-cool-agent@acme.beam.directory", "my-cool-agent-2@acme.beam.directory",
		"my-cool-agent-3@acme.beam.directory"}, ids)
	r := b.call("POST", "/agents/register", map[string]any{"displayName": "Echo", "publicKey": newIdentity(t).pubB64})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	require.Equal(t, "echo-2@beam.directory", r.str("beamId"), "the reserved echo ID is never generated")
}

func TestRegisterRejectsBadKeysAndFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	spki, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	require.NoError(t, err)
	rsaB64 := base64.StdEncoding.EncodeToString(spki)
	good := newIdentity(t).pubB64

	cases := []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"rsa key", map[string]any{"beamId": "r@beam.directory", "displayName": "R", "publicKey": rsaB64}, 400, "INVALID_PUBLIC_KEY"},
		{"garbage key", map[string]any{"beamId": "r@beam.directory", "displayName": "R", "publicKey": "not-a-key"}, 400, "INVALID_PUBLIC_KEY"},
		{"missing key", map[string]any{"beamId": "r@beam.directory", "displayName": "R"}, 400, "INVALID_PUBLIC_KEY"},
		{"key wrong type", map[string]any{"beamId": "r@beam.directory", "displayName": "R", "publicKey": 42}, 400, "INVALID_PUBLIC_KEY"},
		{"missing name", map[string]any{"beamId": "r@beam.directory", "publicKey": good}, 400, "INVALID_DISPLAY_NAME"},
		{"name wrong type", map[string]any{"displayName": 5, "publicKey": good}, 400, "INVALID_DISPLAY_NAME"},
		{"caps wrong type", map[string]any{"displayName": "R", "publicKey": good, "capabilities": "chat"}, 400, "INVALID_CAPABILITIES"},
		{"caps wrong elem", map[string]any{"displayName": "R", "publicKey": good, "capabilities": []any{1}}, 400, "INVALID_CAPABILITIES"},
		{"bad beam id", map[string]any{"beamId": "a.b@evil.com", "displayName": "R", "publicKey": good}, 400, "INVALID_BEAM_ID"},
		{"org mismatch", map[string]any{"beamId": "r@acme.beam.directory", "org": "other", "displayName": "R", "publicKey": good}, 400, "ORG_MISMATCH"},
		{"personal org mismatch", map[string]any{"beamId": "r@beam.directory", "org": "acme", "displayName": "R", "publicKey": good}, 400, "ORG_MISMATCH"},
		{"http endpoint", map[string]any{"displayName": "R", "publicKey": good, "httpEndpoint": "http://example.com/x"}, 400, "INVALID_HTTP_ENDPOINT"},
		{"bad email", map[string]any{"displayName": "R", "publicKey": good, "email": "nope"}, 400, "INVALID_EMAIL"},
		{"bad visibility", map[string]any{"displayName": "R", "publicKey": good, "visibility": "secret"}, 400, "INVALID_VISIBILITY"},
		{"bad logo", map[string]any{"displayName": "R", "publicKey": good, "logoUrl": "javascript:alert(1)"}, 400, "INVALID_LOGO_URL"},
		{"malformed json", `{"displayName": "R",`, 400, "INVALID_JSON"},
		{"empty body", ``, 400, "INVALID_JSON"},
		{"array body", `[1,2]`, 400, "INVALID_BODY"},
		{"string body", `"x"`, 400, "INVALID_BODY"},
		{"null body", `null`, 400, "INVALID_BODY"},
		{"oversized", `{"displayName":"` + strings.Repeat("a", maxBodyBytes) + `"}`, 413, "PAYLOAD_TOO_LARGE"},
	}
	for _, c := range cases {
		r := b.call("POST", "/agents/register", c.body)
		requireErr(t, r, c.status, c.code)
	}
	require.Zero(t, b.reg.Count())
	require.Zero(t, b.dbInt(`SELECT COUNT(*) FROM agents`))
}

func TestRegisterInsecureEndpointNeedsFlag(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.AllowInsecureEndpoints = false })
	body := map[string]any{"displayName": "R", "publicKey": newIdentity(t).pubB64, "httpEndpoint": "http://127.0.0.1:9/x"}
	requireErr(t, b.call("POST", "/agents/register", body), 400, "INVALID_HTTP_ENDPOINT")
	b2 := setup(t)
	require.Equal(t, http.StatusCreated, b2.call("POST", "/agents/register", body).status)
}

func TestReregistration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id = "carol@acme.beam.directory"
	carol := b.register(id, map[string]any{"email": "carol@example.com"})
	path := "/agents/register"

	// (c) no proof, different key: refused, nothing changes.
	intruder := newIdentity(t)
	r := b.call("POST", path, map[string]any{"beamId": id, "displayName": "Evil", "publicKey": intruder.pubB64})
	requireErr(t, r, http.StatusConflict, "BEAM_ID_TAKEN")
	a, _ := b.reg.Get(id)
	require.Equal(t, carol.pubB64, a.PublicKeyB64)

	// (b) no proof, same key: idempotent no-op, public view, no apiKey.
	r = b.call("POST", path, map[string]any{"beamId": id, "displayName": "Renamed", "publicKey": carol.pubB64})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.NotContains(t, r.body, "apiKey")
	require.NotContains(t, r.body, "email")
	require.Equal(t, "Agent "+id, r.body["displayName"])
	_, ok := b.reg.AuthenticateAPIKey(carol.apiKey)
	require.True(t, ok)

	// (a) API key proof: updated, key kept.
	r = b.call("POST", path, map[string]any{"beamId": id, "displayName": "Carol 2", "publicKey": carol.pubB64,
		"capabilities": []string{"x"}}, "x-api-key", carol.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.NotContains(t, r.body, "apiKey")
	require.Equal(t, "Carol 2", r.body["display_name"])
	require.Equal(t, []any{"x"}, r.body["capabilities"])
	require.Equal(t, "carol@example.com", r.body["email"])
	_, ok = b.reg.AuthenticateAPIKey(carol.apiKey)
	require.True(t, ok)

	// An API key of another agent is 403, a wrong one 401.
	other := b.register("other@acme.beam.directory")
	requireErr(t, b.call("POST", path, map[string]any{"beamId": id, "displayName": "X", "publicKey": intruder.pubB64},
		"Authorization", "Bearer "+other.apiKey), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("POST", path, map[string]any{"beamId": id, "displayName": "X", "publicKey": intruder.pubB64},
		"x-api-key", carol.apiKey+"x"), http.StatusUnauthorized, "UNAUTHORIZED")

	// (a) signature proof by the current key with a new key: rotated, fresh apiKey.
	next := newIdentity(t)
	body := b.sign(carol.priv, map[string]any{"action": "agents.register", "beamId": id, "publicKey": next.pubB64}, "n-1",
		map[string]any{"beamId": id, "displayName": "Carol 3", "publicKey": next.pubB64})
	r = b.call("POST", path, body)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	newKey := r.str("apiKey")
	require.True(t, strings.HasPrefix(newKey, "bk_"))
	require.Equal(t, next.pubB64, r.body["publicKey"])
	ks := r.body["keyState"].(map[string]any)
	require.EqualValues(t, 2, ks["total"])
	require.Len(t, ks["revoked"], 1)
	require.Equal(t, carol.pubB64, ks["revoked"].([]any)[0].(map[string]any)["publicKey"])
	_, ok = b.reg.AuthenticateAPIKey(carol.apiKey)
	require.False(t, ok, "the old API key is replaced")
	_, ok = b.reg.AuthenticateAPIKey(newKey)
	require.True(t, ok)
	require.EqualValues(t, 1, b.dbInt(`SELECT COUNT(*) FROM agent_keys WHERE beam_id = ? AND revoked_at IS NOT NULL`, id))

	// The same signed body again: the nonce is spent (and the key changed).
	body2 := b.sign(next.priv, map[string]any{"action": "agents.register", "beamId": id, "publicKey": next.pubB64}, "n-1",
		map[string]any{"beamId": id, "displayName": "Carol 4", "publicKey": next.pubB64})
	requireErr(t, b.call("POST", path, body2), http.StatusConflict, "NONCE_REUSED")

	// A signature by the old (revoked) key fails.
	body3 := b.sign(carol.priv, map[string]any{"action": "agents.register", "beamId": id, "publicKey": carol.pubB64}, "n-2",
		map[string]any{"beamId": id, "displayName": "Carol 5", "publicKey": carol.pubB64})
	requireErr(t, b.call("POST", path, body3), http.StatusUnauthorized, "INVALID_SIGNATURE")

	// A stale timestamp fails.
	stale := b.sign(next.priv, map[string]any{"action": "agents.register", "beamId": id, "publicKey": next.pubB64}, "n-3",
		map[string]any{"beamId": id, "displayName": "Carol 6", "publicKey": next.pubB64})
	b.clock.Advance(6 * time.Minute)
	requireErr(t, b.call("POST", path, stale), http.StatusUnauthorized, "STALE_TIMESTAMP")

	// Old keys cannot come back.
	back := b.sign(next.priv, map[string]any{"action": "agents.register", "beamId": id, "publicKey": carol.pubB64}, "n-4",
		map[string]any{"beamId": id, "displayName": "Carol 7", "publicKey": carol.pubB64})
	requireErr(t, b.call("POST", path, back), http.StatusConflict, "KEY_ALREADY_REVOKED")

	require.EqualValues(t, 2, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'agent.reregister'`))
}

func TestEchoIsReserved(t *testing.T) {
	t.Parallel()
	body := func() map[string]any {
		return map[string]any{"beamId": EchoBeamID, "displayName": "Echo", "publicKey": newIdentity(t).pubB64}
	}
	b := setup(t)
	requireErr(t, b.call("POST", "/agents/register", body()), http.StatusConflict, "RESERVED_BEAM_ID")

	b2 := setup(t, func(c *Config) { c.EchoSecret = "s3cret" })
	requireErr(t, b2.call("POST", "/agents/register", body()), http.StatusUnauthorized, "ECHO_AGENT_SECRET_REQUIRED")
	requireErr(t, b2.call("POST", "/agents/register", body(), "Authorization", "Bearer wrong"), http.StatusUnauthorized, "ECHO_AGENT_SECRET_REQUIRED")
	r := b2.call("POST", "/agents/register", body(), "Authorization", "Bearer s3cret")
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	r = b2.call("POST", "/agents/register", body(), "Authorization", "Bearer s3cret")
	require.Equal(t, http.StatusOK, r.status, "the secret is proof for re-registration")
}

func TestRegistryReloadsAfterRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("dave@acme.beam.directory")
	next := newIdentity(t)
	r := b.call("POST", "/agents/dave@acme.beam.directory/keys/rotate", map[string]any{"newPublicKey": next.pubB64}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	r = b.call("POST", "/acl", map[string]any{"targetBeamId": a.beamID, "intentType": "*", "allowedFrom": "*@beam.directory"}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))

	b.reopen()
	got, ok := b.reg.AuthenticateAPIKey(a.apiKey)
	require.True(t, ok)
	require.Equal(t, next.pub, got.PublicKey)
	require.Len(t, got.Keys, 2)
	require.True(t, got.Keys[0].Revoked())
	require.False(t, got.Keys[1].Revoked())
	require.Len(t, b.reg.Rules(a.beamID), 1)
	ok, _ = b.reg.Allowed("zed@beam.directory", a.beamID, "x")
	require.True(t, ok)
}
