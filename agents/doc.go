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
// With ClientConfig.Protocol "beam/2" intents travel as compact JWS (EdDSA,
// kid = the sender's Beam ID, typ beam-intent+jws) over the same session
// ({"type":"intent","jws":…}) or POST /intents/send (application/jose). The
// client announces beam/2 when it connects (protocol=beam/2) and answers
// beam/2 intents with result JWS (typ beam-result+jws); beam/1 intents it
// still answers in beam/1. Send verifies a result JWS against the
// recipient's key as the directory lists it (Lookup, cached). A recipient
// that speaks beam/1 only makes the directory refuse the intent with
// UNSUPPORTED_PROTOCOL; Send then sends it again as beam/1 with a new nonce
// unless ClientConfig.StrictProtocol is set.
//
// # Pipelines
//
// HandleMesh answers pipeline hops (intent mesh.envelope). A MeshHop names
// who wrote what it carries: From is the frame's authenticated sender, the
// author of the hop's content — the previous actor (PrevActor), or the
// envelope's creator (Creator) for the first hop. A handler must not treat
// a payload past the first hop as the creator's words: the previous actor
// may have written anything. The directory admits each hop by the actor's
// own policy (ACL rules, default policy, org membership) with the agent
// that chose the hop as the sender; an actor that requires sender
// signatures receives hops only with its acceptAttestedPipelineHops
// setting, since the directory, not an agent, signs them.
//
// # Boundaries
//
// The package builds on agents/wire for encoding, signing and verification.
// It imports nothing of the server (directory, bus, tracing); tests run a
// real directory from package beam (the module root). Durable bus operations (send durable,
// poll, ack, leases) are not part of the client yet.
//
// It is a public API (the Go SDK for agents).
package agents
