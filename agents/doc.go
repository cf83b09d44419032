// Package agents is the Go client SDK for Beam agents: an agent's identity
// (a Beam ID and its Ed25519 key pair, stored in the same JSON shape as the
// TypeScript SDK's BeamIdentity.export()), and a Client that registers the
// agent with a directory, looks other agents up, sends signed intents and
// answers the intents sent to it.
//
// # Transport
//
// A Client talks HTTP to the directory for registration, lookup and search.
// After Connect it also holds one WebSocket session (/ws?beamId=…) that proves
// the agent's identity in the upgrade request: with the API key when the
// client has one (x-api-key header), otherwise with signed query parameters
// (timestamp, nonce, and an Ed25519 signature over the canonical JSON of
// {"action":"ws.connect","beamId","nonce","timestamp"}). The client waits for
// the directory's "connected" message before Connect returns, and reconnects
// with exponential backoff and jitter whenever the session drops, until
// Close. Handlers registered with Handle survive reconnects.
//
// Send uses the session while it is up and falls back to POST /intents/send
// otherwise. Either way the intent frame is signed (beam/1: Ed25519 over the
// JavaScript JSON.stringify of {type, from, to, intent, payload, timestamp,
// nonce}); a failure result or a directory error comes back as an *Error
// carrying the errorCode.
//
// Incoming intents are verified against the senderPublicKey the directory
// attaches, and against the replay window, before any handler runs; frames
// that fail are dropped and logged. Results are signed over the sorted
// canonical JSON of all their fields (beam/1).
//
// Only the beam/1 wire protocol is implemented. The directory does not yet
// define how beam/2 (JWS) frames travel over WebSocket and HTTP, so a
// ClientConfig with Protocol "beam/2" is refused by NewClient with
// ErrProtocolUnsupported.
//
// # Boundaries
//
// The package builds on agents/wire for encoding, signing and verification.
// It imports nothing of the server (directory, bus, tracing); tests run a
// real directory from internal/server. Durable bus operations (send durable,
// poll, ack, leases) are not part of the client yet.
package agents
