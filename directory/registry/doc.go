// Package registry is the agent registry of a Beam directory: identities
// (Beam IDs and their Ed25519 keys), API keys, DID documents, key rotation
// and revocation, visibility, delivery endpoints and intent ACL policies,
// with their HTTP routes.
//
// # Storage
//
// The registry keeps its tables in the directory's SQLite file and writes
// them only through tracing.Log.Do (the log's single writer), never through
// a connection of its own. Reads at startup use the log's read-only pool.
// Times are unix microseconds (INTEGER).
//
//	agents(beam_id PK, org, personal, display_name, capabilities JSON,
//	       public_key, api_key_hash, email, email_verified, description,
//	       logo_url, website, trust_score, verified, verification_tier,
//	       visibility, http_endpoint, dh_public_key,
//	       created_at, updated_at, last_seen)
//	agent_keys(beam_id, public_key, created_at, revoked_at NULL,
//	           UNIQUE(beam_id, public_key))       -- key history
//	intent_acls(id PK, target_beam_id, intent_type ('*' = any),
//	            allowed_from (pattern), effect 'allow'|'deny',
//	            created_at, created_by, UNIQUE(target, intent_type, allowed_from))
//	used_nonces(scope, nonce, expires_at, PK(scope, nonce))
//	audit_log(seq PK, at, action, actor, target, details JSON)
//
// Every mutation (register, re-register, delete, rotate, revoke,
// visibility, config, ACL create/delete) runs in one log.Do transaction that
// also writes one audit_log row. last_seen updates (Touch, heartbeats) are
// not audited. The whole registry (agents, key history, ACL rules) is held in
// memory, loaded at Open and replaced after each successful commit, so the
// hot paths (Get, AuthenticateAPIKey, Allowed, Touch) never touch SQLite.
// Mutations are serialized by a registry mutex; they are rare and each is a
// single group-committed transaction.
//
// # Identity and proof of ownership
//
// Only Ed25519 keys are accepted. A Beam ID, once registered, is owned by
// whoever holds its current key or its API key.
//
// An API key is "bk_" + base64url(beamId) + "." + base64url(24 random
// bytes). Only its SHA-256 hex digest is stored; the key itself is returned
// once, at first registration (and again, freshly minted, after a signed
// re-registration). It is accepted as "x-api-key: bk_…" or
// "Authorization: Bearer bk_…".
//
// A signed request carries timestamp (within ±5 minutes of the registry
// clock), nonce (1–128 printable ASCII characters, never reused for the
// same agent; remembered for 10 minutes) and signature: base64 Ed25519 by
// the agent's current key over wire.CanonicalJSON of one of these objects
// (absent new values are null, so a signature always covers them):
//
//	register    {"action":"agents.register","beamId","publicKey","timestamp","nonce"}
//	rotate      {"action":"keys.rotate","beamId","newPublicKey","timestamp","nonce"}
//	revoke      {"action":"keys.revoke","beamId","publicKey","timestamp","nonce"}
//	visibility  {"action":"agents.visibility","beamId","visibility","timestamp","nonce"}
//	config      {"action":"agents.config","beamId","httpEndpoint","dhPublicKey","timestamp","nonce"}
//	            (plus "requireSenderSignatures" when the request sets it)
//	acl create  {"action":"acl.create","targetBeamId","intentType","allowedFrom","effect","timestamp","nonce"}
//	heartbeat   {"type":"heartbeat","beamId","timestamp","nonce"}
//
// The heartbeat travels in the headers x-beam-timestamp, x-beam-nonce and
// x-beam-signature; its insertion-order JSON (the reference's signing
// string) is accepted as well as the canonical one. When an API key is used
// instead, a timestamp and nonce sent along are still checked and recorded.
//
// An operator is whoever Config.OperatorAuth accepts: roles "operator" and
// "admin" may delete agents, change visibility and config, and manage ACLs;
// any accepted role may read full rows and ACLs. Key rotation and
// revocation need the agent itself.
//
// Re-registering an existing Beam ID with proof (API key, or a signature as
// above, or the echo secret for echo@beam.directory) updates the record; a
// new public key rotates the old one out (marked revoked). Without proof and
// with the same public key it is an idempotent no-op that returns the public
// view (SDK 0.5.1 re-registers at every start); without proof and a different
// key it is refused with 409 BEAM_ID_TAKEN. A new key may not be one the
// agent used before (409 KEY_ALREADY_REVOKED); a key rotated out is revoked
// at once, so revoking it later is an idempotent no-op.
//
// echo@beam.directory is reserved: with no Config.EchoSecret it cannot be
// registered (409 RESERVED_BEAM_ID); with one, the request needs
// "Authorization: Bearer <secret>" (else 401 ECHO_AGENT_SECRET_REQUIRED),
// which also serves as proof for re-registration. Generated Beam IDs skip
// it.
//
// Unauthenticated heartbeats (SDK 0.5.1 sends them unsigned) get 200 with
// the public view and change nothing. Touch and heartbeats update last_seen
// without an audit row; Touch persists at most once per agent per
// Config.TouchInterval (memory is always current), and Close flushes.
//
// Client-supplied trust fields (verificationTier, emailVerified, verified,
// trustScore) are ignored. The trust score is computed when an agent is
// viewed: 0.3, +0.3 when verified, +0.2 when the tier is not "basic", +0.2
// when seen within 24 hours, +0.2 when registered more than 7 days ago,
// capped at 1. This registry never sets verified or a tier above basic, so
// scores range 0.3–0.7.
//
// Unlike the reference, the org of a registration without a Beam ID is not
// derived from the email domain: it is the given org, else personal.
//
// # Views
//
// Anonymous callers see the public view (no email, no http_endpoint). The
// agent itself (its API key) and operators see the full row. Unlisted
// agents resolve by exact ID (so they can be messaged) but never appear in
// search results.
//
// # Policy
//
// Allowed(from, to, intentType) evaluates the target's rules whose
// intent_type is intentType or "*" and whose allowed_from matches from ("*";
// an exact Beam ID; "*@domain" = from ends with "@domain"; "*.x" = from
// ends with ".x", i.e. its domain lies beneath x): any matching deny denies; else any matching allow allows;
// else Config.DefaultPolicy decides (same-org: both are org agents of the
// same org; allow; deny). ACLs are managed by the target agent (API key or
// signature) or an operator, never anonymously.
//
// # Handlers
//
// Route handlers return their error instead of writing it; one adapter
// (serve) writes it as {"error", "errorCode"} with its status, or logs it
// and answers 500 INTERNAL_ERROR when it is not a client mistake. The signed
// changes to one agent (key rotation and revocation, visibility, config)
// share one sequence (changeAgent): read the body, take the write lock, load
// the agent, parse, authorize, commit with the nonce and one audit row,
// update the cache, answer with the full view.
//
// The registry does not route intents, verify intent frames or know about
// the echo agent's behaviour; the router does that with Get, Allowed and
// Touch. It must not write SQLite except through log.Do.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package registry
