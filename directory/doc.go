// Package directory is the relay of a Beam directory: it takes signed intent
// frames from agents (POST /intents/send and the WebSocket endpoint /ws),
// validates them, applies the nonce rules, routes them to their recipient
// (the built-in echo agent, the recipient's direct HTTP endpoint, or its
// WebSocket session), returns the result to the sender, and records every
// step of every intent in the event log. It also runs startup recovery for
// intents a previous process left unfinished.
//
// # Validation
//
// A frame is checked in this order: shape (wire.DecodeIntentFrame) →
// sender (on a WebSocket the session's agent, and `from` must equal it; on
// HTTP `from` must be a registered local agent) → signature (required on
// HTTP; on a WebSocket required unless the session authenticated with the
// agent's API key; verified whenever present, once, here at the edge) →
// nonce claim → policy (registry.Allowed, local targets only, the built-in
// echo exempt) → timestamp (±5 minutes) → delivered frame size (at most
// Config.MaxFrameBytes, which is what beam-protocol-sdk 0.5.1 receivers
// accept).
//
// Frames that fail shape, sender or signature are never recorded under
// their nonce, so a forged frame cannot burn someone else's nonce; they are
// logged and counted in beam_frames_rejected_total. An authentic frame with
// a new nonce is always recorded: a policy, timestamp or size failure is
// recorded as received → failed with the error code and a failure result.
// For an authentic frame whose nonce already exists, those failures are
// answered but not recorded.
//
// A frame without a sender signature (from a session opened with the
// agent's API key, a message bus attempt, a frame a peer vouches for) is
// delivered signed by the directory's attestation key and marked attested
// (attested.go, package attest); a recipient with requireSenderSignatures
// refuses it (403 SENDER_SIGNATURE_REQUIRED, recorded received → failed).
//
// A beam/2 intent (a compact JWS: WebSocket {"type":"intent","jws"}, or
// POST /intents/send with Content-Type application/jose) takes the same
// path; its JWS is the signature step (beam2.go). With Config.Catalog set,
// the catalog is checked after policy and before the timestamp
// (catalog.go).
//
// # Nonces
//
// The nonce is the global idempotency key (tracing.IntentRow.Nonce):
//
//   - new: claimed in memory (so two concurrent first frames cannot both
//     start it), then recorded received (frame, client timestamp, payload
//     hash = sha256 of the JavaScript-normalised payload, timeout) and
//     validated. The log is not read first: a nonce it already has refuses
//     the received event and the frame takes the replay path; nonces the
//     bus may hold in received are looked up first (busnonces.go);
//   - in flight (claimed here, or non-terminal in the log): IN_PROGRESS;
//   - same nonce with a different from, to, intent or payload:
//     NONCE_REUSE_CONFLICT;
//   - acked, or failed with a non-retryable code: the cached result
//     (tracing.IntentRow.ResultJSON), never a second delivery;
//   - failed with a retryable code (OFFLINE, TIMEOUT, DELIVERY_FAILED,
//     DIRECT_HTTP_FAILED): a new attempt, recorded queued (attempt+1) →
//     dispatched → …
//
// # Routing and events
//
// echo@beam.directory, when not registered or not reachable, is answered by
// the built-in echo. A recipient with an HTTP endpoint is POSTed to first; a
// failure there is noted in the event details and the intent falls through
// to the recipient's WebSocket session. Without a session the intent fails
// OFFLINE (retryable). Events: received, validated, dispatched (transport,
// timeoutMs), delivered, then acked or failed (errorCode, latencyMs, the
// result frame). dispatched is committed before the frame leaves the
// process; delivered is recorded after the frame was written, without
// holding up the session's writer: delivered events of many intents share
// one append after Config.DeliveredDelay, or ride in the append of the
// intent's outcome when the result comes first (delivered.go); either way
// delivered precedes acked or failed in the log. A successful
// result whose payload says "terminal": false (async acceptance) leaves the
// intent delivered. Results are accepted only from the addressed
// recipient's current session. A result that arrives after a timeout is
// recorded as a failed → failed annotation with lateResult:true; one that
// arrives for an intent still delivered (after a restart) finalizes it.
//
// # One door for the other owners
//
// The message bus and the pipeline gateway own their nonces and append
// every event of them. They hand frames to recipients through Deliver
// (door.go) alone: one operation for the session, direct-HTTP and peer
// paths that applies the recipient's policy on each (the relay's ACL check
// and end-to-end signature rule) and attests unsigned frames. A frame
// written to a session is reported to its owner (Owner.Delivered, batched
// as the directory's own delivered events are), which appends delivered
// itself, so each nonce has one writer. The directory names neither the bus
// nor the pipelines: it hears them as a sessionOwner, reaches federation
// and the cluster through Remote and NodeRouter, all given in Config.
//
// # Errors
//
// POST /intents/send answers 200 with the bare result frame (a success, or
// the recipient's own failure result), otherwise {"error", "errorCode"}:
// 400 INVALID_JSON, INVALID_INTENT (shape, unknown sender, signature, and
// every BAD_REQUEST such as a stale timestamp, with "reason":"BAD_REQUEST");
// 403 FORBIDDEN; 409 IN_PROGRESS, NONCE_REUSE_CONFLICT; 413
// FRAME_TOO_LARGE, PAYLOAD_TOO_LARGE (body over 64 KiB); 502
// DIRECT_HTTP_FAILED, DELIVERY_FAILED; 503 {"error":"agent_offline",
// "errorCode":"OFFLINE"}; 504 TIMEOUT; 500 RELAY_ERROR only when the log
// cannot be written. A replayed nonce whose intent failed in the directory
// gets the same status again. On a WebSocket every failure is an error
// message {"type":"error", "nonce", "errorCode", "message"} followed by an
// unsigned failure result {"type":"result", "frame"} for the same nonce.
//
// # WebSocket sessions
//
// A session must prove its identity in the upgrade request: the agent's API
// key (apiKey query parameter, x-api-key header or Authorization: Bearer),
// or a signed connect token (timestamp, nonce, signature query parameters:
// Ed25519 over wire.CanonicalJSON of {"action":"ws.connect","beamId",
// "nonce","timestamp"}), or a beam/2 JWS token. Unauthenticated sessions are
// accepted only with Config.AllowLegacyWSIdentity. Each session has a
// bounded send queue drained by a writer goroutine that runs while there is
// something to write; a session whose queue overflows is closed (1008 "too
// slow") so that a slow agent never stalls others. Workers that handle a
// session's messages also run only on demand, and the keepalive ping is a
// timer. An idle session's reader holds no buffer and, on Linux, no
// goroutine either: after a second without messages it is parked in a
// process-wide epoll set and started again when its socket becomes
// readable; elsewhere it waits on a short stack (internal/wspark, which
// BEAM_TRICKS_OFF=wspark turns off: the reader then blocks in the library).
//
// The package must not write SQLite except through the event log, must not
// keep an intent's state anywhere but the log (the in-memory claims and
// waiters only mirror what is in flight in this process), and does not own
// the agent registry (directory/registry), the message bus, the pipelines
// or federation, and imports none of them.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package directory
