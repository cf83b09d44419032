package registry

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

func TestLookupViews(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("erin@acme.beam.directory", map[string]any{"email": "erin@example.com", "httpEndpoint": "https://erin.example.com/in"})
	other := b.register("frank@acme.beam.directory")

	for _, path := range []string{"/agents/erin@acme.beam.directory", "/agents/erin%40acme.beam.directory", "/agents/ERIN%40acme.beam.directory"} {
		r := b.call("GET", path, nil)
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		require.Equal(t, "erin@acme.beam.directory", r.body["beamId"])
		for _, k := range []string{"email", "http_endpoint", "httpEndpoint", "email_verified", "apiKey", "api_key_hash"} {
			require.NotContains(t, r.body, k)
		}
		require.Contains(t, r.body, "did")
		require.Contains(t, r.body, "keyState")
	}
	// Another agent's key sees the public view too.
	r := b.call("GET", "/agents/"+esc(a.beamID), nil, "x-api-key", other.apiKey)
	require.NotContains(t, r.body, "email")
	// The owner and operators see the full row.
	for _, h := range [][]string{{"x-api-key", a.apiKey}, {"Authorization", "Bearer " + a.apiKey}, {"Authorization", "Bearer " + operatorToken}, {"Authorization", "Bearer " + viewerToken}} {
		r := b.call("GET", "/agents/"+esc(a.beamID), nil, h...)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "erin@example.com", r.body["email"])
		require.Equal(t, "https://erin.example.com/in", r.body["http_endpoint"])
		require.NotContains(t, r.body, "apiKey")
	}

	requireErr(t, b.call("GET", "/agents/nobody@acme.beam.directory", nil), http.StatusNotFound, "NOT_FOUND")
	requireErr(t, b.call("GET", "/agents/not-an-id", nil), http.StatusBadRequest, "INVALID_BEAM_ID")
	requireErr(t, b.call("GET", "/agents/x@example.com", nil), http.StatusBadRequest, "INVALID_BEAM_ID")

	r = b.call("GET", "/agents/"+esc(a.beamID)+"/keys", nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, a.beamID, r.body["beamId"])
	require.EqualValues(t, 1, r.body["keyState"].(map[string]any)["total"])
	requireErr(t, b.call("GET", "/agents/nobody@beam.directory/keys", nil), http.StatusNotFound, "NOT_FOUND")
	requireErr(t, b.call("GET", "/agents/x@beam.directory/other", nil), http.StatusNotFound, "NOT_FOUND")
}

func TestSearch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register("a1@acme.beam.directory", map[string]any{"capabilities": []string{"chat", "search"}, "description": "Weather oracle"})
	b.register("a2@acme.beam.directory", map[string]any{"capabilities": []string{"chat"}})
	b.register("a3@beta.beam.directory", map[string]any{"capabilities": []string{"search"}})
	hidden := b.register("hidden@acme.beam.directory", map[string]any{"visibility": "unlisted", "capabilities": []string{"chat", "search"}})

	ids := func(r resp) []string {
		var out []string
		for _, a := range r.body["agents"].([]any) {
			out = append(out, a.(map[string]any)["beamId"].(string))
		}
		return out
	}
	r := b.call("GET", "/agents/search", nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, []string{"a1@acme.beam.directory", "a2@acme.beam.directory", "a3@beta.beam.directory"}, ids(r))
	require.EqualValues(t, 3, r.body["total"])
	for _, a := range r.body["agents"].([]any) {
		require.NotContains(t, a.(map[string]any), "email")
	}

	r = b.call("GET", "/agents/search?org=acme&capabilities=chat,search", nil)
	require.Equal(t, []string{"a1@acme.beam.directory"}, ids(r))
	r = b.call("GET", "/agents/search?q=weather", nil)
	require.Equal(t, []string{"a1@acme.beam.directory"}, ids(r))
	r = b.call("GET", "/agents/search?limit=2", nil)
	require.Len(t, ids(r), 2)
	require.EqualValues(t, 3, r.body["total"])
	r = b.call("GET", "/agents/search?minTrustScore=0.9", nil)
	require.Empty(t, r.body["agents"])
	requireErr(t, b.call("GET", "/agents/search?limit=abc", nil), http.StatusBadRequest, "INVALID_QUERY")
	requireErr(t, b.call("GET", "/agents/search?minTrustScore=x", nil), http.StatusBadRequest, "INVALID_QUERY")

	// Unlisted agents are resolvable by exact ID.
	r = b.call("GET", "/agents/"+esc(hidden.beamID), nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "unlisted", r.body["visibility"])

	// Visibility can be switched by the owner.
	r = b.call("PATCH", "/agents/"+esc(hidden.beamID)+"/visibility", map[string]any{"visibility": "public"}, "x-api-key", hidden.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	r = b.call("GET", "/agents/search?org=acme&capabilities=search", nil)
	require.Equal(t, []string{"a1@acme.beam.directory", "hidden@acme.beam.directory"}, ids(r))
}

func TestDIDDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("gina@acme.beam.directory")

	for _, path := range []string{"/did/did:beam:acme:gina", "/agents/did/did:beam:acme:gina", "/did/" + wire.KeyDID(a.pub)} {
		r := b.call("GET", path, nil)
		require.Equal(t, http.StatusOK, r.status, path+" "+string(r.raw))
		require.Equal(t, "application/did+json", r.header.Get("Content-Type"))
		require.Equal(t, "did:beam:acme:gina", r.body["id"])
		require.Contains(t, r.body["@context"], "https://www.w3.org/ns/did/v1")
		vms := r.body["verificationMethod"].([]any)
		require.Len(t, vms, 1)
		vm := vms[0].(map[string]any)
		require.Equal(t, "Ed25519VerificationKey2020", vm["type"])
		require.Equal(t, wire.Multibase(a.pub), vm["publicKeyMultibase"])
		require.Equal(t, "active", vm["beamStatus"])
		require.Equal(t, []any{vm["id"]}, r.body["authentication"])
		require.Equal(t, []any{vm["id"]}, r.body["assertionMethod"])
	}
	requireErr(t, b.call("GET", "/did/did:beam:acme:nobody", nil), http.StatusNotFound, "NOT_FOUND")
	requireErr(t, b.call("GET", "/did/did:web:example.com", nil), http.StatusNotFound, "NOT_FOUND")
	requireErr(t, b.call("GET", "/agents/did/garbage", nil), http.StatusNotFound, "NOT_FOUND")

	// After a rotation the old key is listed as revoked and the new one is
	// the authentication key.
	next := newIdentity(t)
	r := b.call("POST", "/agents/"+esc(a.beamID)+"/keys/rotate", map[string]any{"newPublicKey": next.pubB64}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	r = b.call("GET", "/did/did:beam:acme:gina", nil)
	vms := r.body["verificationMethod"].([]any)
	require.Len(t, vms, 2)
	old, cur := vms[0].(map[string]any), vms[1].(map[string]any)
	require.Equal(t, wire.Multibase(a.pub), old["publicKeyMultibase"])
	require.Equal(t, "revoked", old["beamStatus"])
	require.NotEmpty(t, old["beamRevokedAt"])
	require.Equal(t, "active", cur["beamStatus"])
	require.Equal(t, []any{cur["id"]}, r.body["authentication"])
	// The old key's DID still resolves to the agent.
	require.Equal(t, http.StatusOK, b.call("GET", "/did/"+wire.KeyDID(a.pub), nil).status)
}

func TestRotateAndRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("hank@acme.beam.directory")
	base := "/agents/" + esc(a.beamID) + "/keys/"

	k2 := newIdentity(t)
	requireErr(t, b.call("POST", base+"rotate", map[string]any{"newPublicKey": k2.pubB64}), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("POST", base+"rotate", map[string]any{"newPublicKey": a.pubB64}, "x-api-key", a.apiKey), http.StatusBadRequest, "NOOP_ROTATION")
	requireErr(t, b.call("POST", base+"rotate", map[string]any{"newPublicKey": "zz"}, "x-api-key", a.apiKey), http.StatusBadRequest, "INVALID_PUBLIC_KEY")
	requireErr(t, b.call("POST", base+"rotate", map[string]any{"newPublicKey": k2.pubB64}, "Authorization", "Bearer "+operatorToken), http.StatusForbidden, "FORBIDDEN")

	// API key rotation.
	r := b.call("POST", base+"rotate", map[string]any{"newPublicKey": k2.pubB64}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, true, r.body["rotated"])
	require.Equal(t, a.pubB64, r.body["previousKey"])
	require.Equal(t, k2.pubB64, r.body["agent"].(map[string]any)["publicKey"])
	got, _ := b.reg.Get(a.beamID)
	require.Equal(t, k2.pub, got.PublicKey)

	// Signed rotation by the current key; the old key's signature fails.
	k3 := newIdentity(t)
	obj := map[string]any{"action": "keys.rotate", "beamId": a.beamID, "newPublicKey": k3.pubB64}
	requireErr(t, b.call("POST", base+"rotate", b.sign(a.priv, obj, "r1", map[string]any{"newPublicKey": k3.pubB64})),
		http.StatusUnauthorized, "INVALID_SIGNATURE")
	signed := b.sign(k2.priv, obj, "r2", map[string]any{"newPublicKey": k3.pubB64})
	r = b.call("POST", base+"rotate", signed)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, k2.pubB64, r.body["previousKey"])
	// Replaying the same signed body: the nonce is spent.
	k4 := newIdentity(t)
	obj4 := map[string]any{"action": "keys.rotate", "beamId": a.beamID, "newPublicKey": k4.pubB64}
	requireErr(t, b.call("POST", base+"rotate", b.sign(k3.priv, obj4, "r2", map[string]any{"newPublicKey": k4.pubB64})),
		http.StatusConflict, "NONCE_REUSED")
	// A signature over different values does not verify.
	requireErr(t, b.call("POST", base+"rotate", b.sign(k3.priv, obj, "r3", map[string]any{"newPublicKey": k4.pubB64})),
		http.StatusUnauthorized, "INVALID_SIGNATURE")
	// Missing nonce with a signature.
	bad := b.sign(k3.priv, obj4, "r4", map[string]any{"newPublicKey": k4.pubB64})
	delete(bad, "nonce")
	requireErr(t, b.call("POST", base+"rotate", bad), http.StatusBadRequest, "INVALID_NONCE")
	// Stale timestamp with a signature.
	stale := b.sign(k3.priv, obj4, "r5", map[string]any{"newPublicKey": k4.pubB64})
	b.clock.Advance(-10 * time.Minute)
	requireErr(t, b.call("POST", base+"rotate", stale), http.StatusUnauthorized, "STALE_TIMESTAMP")
	b.clock.Advance(10 * time.Minute)

	// Revoke: the active key cannot be revoked; an old one can (it is
	// already revoked by rotation, so this is idempotent).
	requireErr(t, b.call("POST", base+"revoke", map[string]any{"publicKey": k3.pubB64}, "x-api-key", a.apiKey), http.StatusConflict, "ACTIVE_KEY_REQUIRED")
	requireErr(t, b.call("POST", base+"revoke", map[string]any{"publicKey": k4.pubB64}, "x-api-key", a.apiKey), http.StatusNotFound, "KEY_NOT_FOUND")
	r = b.call("POST", base+"revoke", map[string]any{"publicKey": a.pubB64}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, true, r.body["revoked"])
	require.Equal(t, a.pubB64, r.body["revokedKey"])
	robj := map[string]any{"action": "keys.revoke", "beamId": a.beamID, "publicKey": k2.pubB64}
	r = b.call("POST", base+"revoke", b.sign(k3.priv, robj, "v1", map[string]any{"publicKey": k2.pubB64}))
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	ks := r.body["keyState"].(map[string]any)
	require.EqualValues(t, 3, ks["total"])
	require.Len(t, ks["revoked"], 2)
	require.Equal(t, k3.pubB64, ks["active"].(map[string]any)["publicKey"])

	r = b.call("GET", "/agents/"+esc(a.beamID)+"/keys", nil)
	require.EqualValues(t, 3, r.body["keyState"].(map[string]any)["total"])
	require.EqualValues(t, 2, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'keys.rotate'`))
}

func TestDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("ivy@acme.beam.directory")
	other := b.register("jack@acme.beam.directory")
	path := "/agents/" + esc(a.beamID)
	requireErr(t, b.call("DELETE", path, nil), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("DELETE", path, nil, "x-api-key", other.apiKey), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("DELETE", path, nil, "Authorization", "Bearer "+viewerToken), http.StatusForbidden, "FORBIDDEN")
	require.Equal(t, http.StatusCreated, b.call("POST", "/acl", map[string]any{"targetBeamId": a.beamID, "intentType": "*", "allowedFrom": "*"}, "x-api-key", a.apiKey).status)

	r := b.call("DELETE", path, nil, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusNoContent, r.status, string(r.raw))
	requireErr(t, b.call("GET", path, nil), http.StatusNotFound, "NOT_FOUND")
	_, ok := b.reg.AuthenticateAPIKey(a.apiKey)
	require.False(t, ok)
	require.Empty(t, b.reg.Rules(a.beamID))
	require.Zero(t, b.dbInt(`SELECT COUNT(*) FROM intent_acls`))
	require.Zero(t, b.dbInt(`SELECT COUNT(*) FROM agent_keys WHERE beam_id = ?`, a.beamID))
	require.EqualValues(t, 1, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'agent.delete'`))

	requireErr(t, b.call("DELETE", "/agents/"+esc(other.beamID), nil, "x-api-key", a.apiKey), http.StatusUnauthorized, "UNAUTHORIZED")
	require.Equal(t, http.StatusNoContent, b.call("DELETE", "/agents/"+esc(other.beamID), nil, "Authorization", "Bearer "+operatorToken).status)
	requireErr(t, b.call("DELETE", "/agents/"+esc(other.beamID), nil, "Authorization", "Bearer "+operatorToken), http.StatusNotFound, "NOT_FOUND")
	require.Zero(t, b.reg.Count())
	// The Beam ID is tombstoned until an operator releases it.
	id := newIdentity(t)
	body := map[string]any{"beamId": a.beamID, "displayName": "Newcomer", "publicKey": id.pubB64}
	requireErr(t, b.call("POST", "/agents/register", body), http.StatusConflict, "BEAM_ID_RETIRED")
	require.Equal(t, http.StatusNoContent, b.call("POST", path+"/release", nil, "Authorization", "Bearer "+operatorToken).status)
	b.register(a.beamID)
}

func TestVisibilityAndConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("kim@acme.beam.directory")
	vis := "/agents/" + esc(a.beamID) + "/visibility"
	cfg := "/agents/" + esc(a.beamID) + "/config"

	requireErr(t, b.call("PATCH", vis, map[string]any{"visibility": "unlisted"}), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("PATCH", vis, map[string]any{"visibility": "nope"}, "x-api-key", a.apiKey), http.StatusBadRequest, "INVALID_VISIBILITY")
	requireErr(t, b.call("PATCH", vis, map[string]any{"visibility": 1}, "x-api-key", a.apiKey), http.StatusBadRequest, "INVALID_VISIBILITY")
	r := b.call("PATCH", vis, b.sign(a.priv, map[string]any{"action": "agents.visibility", "beamId": a.beamID, "visibility": "unlisted"}, "v1",
		map[string]any{"visibility": "unlisted"}))
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, "unlisted", r.body["visibility"])
	r = b.call("PATCH", vis, map[string]any{"visibility": "public"}, "Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))

	// Config: the signature covers the new endpoint; a body with another
	// endpoint than the signed one is refused.
	obj := map[string]any{"action": "agents.config", "beamId": a.beamID, "httpEndpoint": "https://kim.example.com/a", "dhPublicKey": nil}
	tampered := b.sign(a.priv, obj, "c1", map[string]any{"httpEndpoint": "https://evil.example.com/a"})
	requireErr(t, b.call("PATCH", cfg, tampered), http.StatusUnauthorized, "INVALID_SIGNATURE")
	good := b.sign(a.priv, obj, "c2", map[string]any{"httpEndpoint": "https://kim.example.com/a"})
	r = b.call("PATCH", cfg, good)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, "https://kim.example.com/a", r.body["http_endpoint"])
	requireErr(t, b.call("PATCH", cfg, good), http.StatusConflict, "NONCE_REUSED")
	got, _ := b.reg.Get(a.beamID)
	require.Equal(t, "https://kim.example.com/a", got.HTTPEndpoint)

	requireErr(t, b.call("PATCH", cfg, map[string]any{"httpEndpoint": "ftp://x"}, "x-api-key", a.apiKey), http.StatusBadRequest, "INVALID_HTTP_ENDPOINT")
	requireErr(t, b.call("PATCH", cfg, map[string]any{}, "x-api-key", a.apiKey), http.StatusBadRequest, "INVALID_BODY")
	r = b.call("PATCH", cfg, map[string]any{"httpEndpoint": ""}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	got, _ = b.reg.Get(a.beamID)
	require.Empty(t, got.HTTPEndpoint)
	require.EqualValues(t, 2, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'agent.config'`))
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("lee@acme.beam.directory")
	path := "/agents/" + esc(a.beamID) + "/heartbeat"
	b.clock.Advance(time.Hour)

	// Unsigned (SDK 0.5.1): 200 public view, nothing changes.
	r := b.call("POST", path, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, "2026-05-01T12:00:00.000Z", r.body["lastSeen"])
	require.NotContains(t, r.body, "email")
	got, _ := b.reg.Get(a.beamID)
	require.Equal(t, time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), got.LastSeen)
	requireErr(t, b.call("POST", "/agents/nobody@beam.directory/heartbeat", nil), http.StatusNotFound, "NOT_FOUND")

	// Signed headers.
	ts := b.ts()
	sig, err := wire.SignCanonical(map[string]any{"type": "heartbeat", "beamId": a.beamID, "timestamp": ts, "nonce": "h1"}, a.priv)
	require.NoError(t, err)
	r = b.call("POST", path, nil, "x-beam-timestamp", ts, "x-beam-nonce", "h1", "x-beam-signature", sig)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, "2026-05-01T13:00:00.000Z", r.body["lastSeen"])
	require.EqualValues(t, b.clock.Now().UnixMicro(), b.dbInt(`SELECT last_seen FROM agents WHERE beam_id = ?`, a.beamID))
	requireErr(t, b.call("POST", path, nil, "x-beam-timestamp", ts, "x-beam-nonce", "h1", "x-beam-signature", sig), http.StatusConflict, "NONCE_REUSED")
	requireErr(t, b.call("POST", path, nil, "x-beam-timestamp", ts, "x-beam-nonce", "h2", "x-beam-signature", sig), http.StatusUnauthorized, "INVALID_SIGNATURE")

	// The reference's insertion-order signing string is accepted too.
	b.clock.Advance(time.Minute)
	ts = b.ts()
	msg := []byte(`{"type":"heartbeat","beamId":"` + a.beamID + `","timestamp":"` + ts + `","nonce":"h3"}`)
	r = b.call("POST", path, nil, "x-beam-timestamp", ts, "x-beam-nonce", "h3", "x-beam-signature", wire.Sign(msg, a.priv))
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, "2026-05-01T13:01:00.000Z", r.body["lastSeen"])

	// API key.
	b.clock.Advance(time.Minute)
	r = b.call("POST", path, nil, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, "2026-05-01T13:02:00.000Z", r.body["lastSeen"])
	require.Contains(t, r.body, "email")
}

func TestTouchCoalescesWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("mia@acme.beam.directory")
	start := b.clock.Now()

	b.clock.Advance(time.Minute)
	t1 := b.clock.Now()
	b.reg.Touch(a.beamID)
	got, _ := b.reg.Get(a.beamID)
	require.Equal(t, t1, got.LastSeen)
	require.Eventually(t, func() bool {
		return b.dbInt(`SELECT last_seen FROM agents WHERE beam_id = ?`, a.beamID) == t1.UnixMicro()
	}, 10*time.Second, 5*time.Millisecond)

	// Within the interval: memory moves, the row does not.
	b.clock.Advance(10 * time.Second)
	b.reg.Touch(a.beamID)
	got, _ = b.reg.Get(a.beamID)
	require.Equal(t, t1.Add(10*time.Second), got.LastSeen)
	b.reg.Touch("unknown@beam.directory")
	require.NoError(t, b.reg.Close(context.Background()))
	require.Equal(t, t1.UnixMicro(), b.dbInt(`SELECT last_seen FROM agents WHERE beam_id = ?`, a.beamID))
	require.True(t, t1.After(start))
}
