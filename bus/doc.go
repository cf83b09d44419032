// Package bus is the durable message bus: POST /v1/beam/send, GET
// /v1/beam/poll (with leases), POST /v1/beam/ack, POST /v1/beam/lease,
// history, stats, dead letters and operator requeue. It runs in the
// directory's process, on the directory's log, and delivers through the
// directory's WebSocket sessions. A message is kept until it is acked or
// visibly dead (dead_letter); it is never silently dropped.
//
// # Messages are intents owned by the bus
//
// A message is a nonce in the same log and nonce space as the directory's
// intents. Its received event carries details.owner "bus" and details.bus
// {messageId, payload, priority, maxRetries, traceId}, plus extra
// payloadHash (the directory's hash, so either side detects a reused
// nonce) and auth (how the sender was authenticated). The message rows
// (tracing.MessageRow, read with tracing.Log.Message, Messages, …) are the
// tracing package's projection of those events; the bus writes nothing but
// events (tracing.Log.Append / Do), each committed before the HTTP answer
// or the frame leaves. While a send records a new nonce it holds the
// directory's in-memory claim on it (every writer of a new nonce claims it
// first) until received is committed. A nonce the log may hold in received
// (ClaimNewBusNonce says so) is looked up first; any other is recorded
// optimistically, and the log's refusal of received after another state is
// answered as a resend.
// The directory answers a POST /intents/send of a bus nonce from the log
// (cached result, IN_PROGRESS) and never delivers it itself.
//
// # Cost per message
//
// A send to an online local recipient writes received and dispatched in
// one append (to an offline one, or one at PerRecipient, received and
// queued), folds the message row from the committed events in memory and
// reads nothing back before the frame leaves. The outcome of a WebSocket
// attempt is recorded from the attempt's in-memory mirror (Bus.flights),
// which every other state change of the nonce by the bus drops, so a stale
// outcome is ignored without a read. Only recipients marked as possibly
// having queued messages are looked up after an attempt ends. The remaining
// reads are statements prepared once (reads.go).
//
// # Authentication
//
// A send is authenticated as its sender: a signed beam/1 frame ({"frame":
// frame} or the frame as the body; signature and ±5 min window checked), a
// beam/2 JWS ({"frame":"<jws>"}), the sender's API key (x-api-key or
// Authorization: Bearer bk_…), or the operator bus key (BEAM_BUS_API_KEY,
// Authorization: Bearer) with which a trusted back-end may send for any
// local agent. The directory's operator token has the bus key's rights.
// No agent private key is ever held. Poll, ack and lease renewal act as
// the recipient (its API key) or with the bus key; history, stats and
// dead-letter lists show an agent only its own messages; requeue needs the
// bus key or the operator token.
//
// # Frames
//
// A signed beam/1 frame is forwarded verbatim on every attempt, so its
// signature still verifies; a retry therefore carries the original
// timestamp. With API-key, bus-key or JWS authentication there is no
// sender signature: each attempt gets a frame with the same nonce and a
// fresh timestamp, signed by the directory's attestation key and
// delivered with that key as senderPublicKey and an "attestation" member
// (directory/attest, docs/SECURITY.md); the dispatched event records
// details.attestation {by, keyId, auth}. beam-protocol-sdk 0.5.1 receivers
// accept it (they check the signature against senderPublicKey); the Go SDK
// checks it against the directory's published key and reports
// Intent.Attested. Every bus delivery carries, outside the frame,
// "bus":{"messageId","attempt","auth"}. The Go SDK skips the ±5 min window
// for bus deliveries (the log guards the nonce; a retried signed frame may
// be older); SDK 0.5.1 does not, so signed retries older than 5 minutes
// are dropped there (they end in dead_letter).
//
// A recipient with requireSenderSignatures (registry setting) accepts only
// sender-signed beam/1 frames: other sends to it are refused with 403
// SENDER_SIGNATURE_REQUIRED, and a message queued before it turned the
// setting on is dead-lettered with that code, never delivered attested.
//
// No session acknowledges receipt: delivered means the frame was written
// to the recipient's session. An attempt that then gets no result within
// DeliveryTimeout is recorded as TIMEOUT with an error saying that the
// recipient did not answer that attempt and may have rejected the frame,
// and details sessionProtocol, sessionAuth and noAnswer.
//
// # Delivery, retries, dead letters
//
// A message to an online recipient is dispatched at once (received →
// dispatched → delivered) through directory.Deliver: the directory's
// bounded session queue, the recipient's policy applied again, delivered
// appended by the bus itself when the directory reports the frame written, results accepted only from the recipient's
// current session, routed back to the bus (not to the directory's
// synchronous path). To an offline recipient it is queued with no
// next_retry_at ("waiting for the recipient": no attempt is counted) and
// delivered the moment the recipient attaches a session
// (Connected, through the directory's Config.Owners), at most PerRecipient attempts in flight per
// recipient. A success result acks it (response = the result payload); an
// async acceptance ("terminal": false) leaves it delivered until POST
// /v1/beam/ack; a failure result, TIMEOUT (no result within
// DeliveryTimeout) or DELIVERY_FAILED is retried: retry_count+1 and
// queued with next_retry_at = now + Schedule[n-1] ± Jitter (deterministic
// per nonce and attempt; defaults 30/60/120/240 s ±15 %), until
// MaxAttempts (5) attempts are used: then dead_letter. Non-retryable codes
// (BAD_REQUEST, FORBIDDEN, INVALID_INTENT, NONCE_REUSE_CONFLICT,
// UNAUTHORIZED, UNKNOWN_SENDER, UNKNOWN_AGENT, UNSUPPORTED_INTENT,
// FRAME_TOO_LARGE, PAYLOAD_TOO_LARGE) dead-letter at once. The schedule is
// in the log (details.nextRetryAt), so it survives restarts. Requeue
// (operator) moves dead_letter or failed back to queued with retry_count
// 0 and the same nonce and delivers at once if the recipient is online.
//
// # Recipients in peer directories
//
// With a federation router installed (Config.Remote: the federation
// node), a message whose recipient is not a local agent but is
// served by a pinned peer is accepted (the peer applies its own policies)
// and each attempt is handed to the federation outbox instead of a local
// session: Remote.Forward commits the dispatched event (transport
// federation, details.peer) and the outbox row in one transaction, and the
// send answers "dispatched" at once. The relay publishes the frame until
// the peer answers — retrying with backoff while the peer is down — and
// records the outcome on the nonce (delivered, acked or failed;
// dead_letter when the row dies); the bus's outcome hook
// (RemoteOutcome, federation.Config.BusOutcome) then counts it and notifies the sender. A
// sender-signed beam/1 frame travels verbatim (the peer verifies the
// agent's signature); API-key, bus-key and JWS sends travel as an unsigned
// frame this directory vouches for in its signed federation message, which
// the peer delivers attested, refusing it (SENDER_SIGNATURE_REQUIRED, the
// message's failed outcome) for an agent that requires sender signatures.
// Recover and
// Tick leave messages dispatched through federation to the outbox; the
// bus's own schedule does not apply to them (the recipient's failure
// result ends the message failed).
//
// # Poll and leases
//
// GET /v1/beam/poll?agent= lists the accepted, non-terminal deliveries
// (status delivered). With claim=true&lease=SECONDS (default 60, max 1 h)
// it hands out queued messages under a new lease id: each becomes
// dispatched (transport poll, details.leaseOwner/leaseExpiresAt) and
// counts as an attempt. POST /v1/beam/lease renews a live lease. An ack of
// a leased message must carry its lease_id and arrive before expiry
// (dispatched → delivered → acked|failed); otherwise 409 INVALID_STATE
// with reason LEASE_MISMATCH or LEASE_EXPIRED. Tick returns expired leases
// to queued, due at once, with the attempt counted.
//
// # Restart rules (seed 003)
//
// Recover: received and dispatched (WebSocket or leased) messages are
// requeued at once with the same nonce (retry_count kept); queued ones
// keep next_retry_at; delivered, acked, failed and dead_letter are
// unchanged. A delivered message that still waited for a WebSocket result
// may get it late (LateResult, through the directory's Config.Owners); if none comes within
// DeliveryTimeout of its delivery, Tick retries it as TIMEOUT. Async
// acceptances stay delivered until acked.
//
// # Errors
//
// {"error","errorCode"} (plus "reason" for lease conflicts): 400
// INVALID_JSON, MISSING_REQUIRED_FIELDS, INVALID_PAYLOAD, INVALID_STATUS,
// MISSING_MESSAGE_ID, MISSING_AGENT; 401 UNAUTHORIZED; 403 FORBIDDEN,
// SENDER_SIGNATURE_REQUIRED; 404
// UNKNOWN_AGENT, MESSAGE_NOT_FOUND; 409 NONCE_REUSE_CONFLICT, IN_PROGRESS,
// INVALID_STATE; 413 PAYLOAD_TOO_LARGE (body over 64 KiB, or a delivered
// frame over the directory's MaxFrameBytes); 500 INTERNAL_ERROR only when
// the log cannot be read or written.
//
// Time comes from Config.Clock; the worker (Tick) is started by Start and
// called directly by tests. The package must not write SQLite except
// through the log, must not keep a message's state anywhere but the log
// (its maps only mirror attempts in flight in this process), and does not
// own sessions, the registry or federation (it reaches federation only
// through the Remote interface).
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package bus
