// Package federation connects Beam directories over NATS so that an agent
// of one directory reaches an agent of another as if it were local, with
// one trace per intent on each side, linked by the nonce.
//
// # Identity and peers
//
// Each directory has a domain (acme.beam.directory) and an Ed25519
// directory key, generated in its data directory on first start
// (LoadOrCreateKey, file directory.key). The same key is the directory's
// NATS identity: nkeys.FromRawSeed(PrefixByteUser, seed) gives the "U…"
// nkey, so pinning a peer's Ed25519 key also pins its NATS user. A peer is
// pinned by its line DOMAIN=nats://HOST:PORT#PUBLICKEY (base64url of the
// 32-byte key; `beam peer show-self` prints it), at start (--peer) or at
// run time (AddPeer, the operator API, `beam peer add`). Peers are stored
// in the table federation_peers of the log's SQLite file.
//
// # Subjects and permissions
//
// Every federation message travels as a NATS request on
//
//	beam.fed.<target>.<origin>.<kind>     kind ∈ intent, resolve
//
// where <target> and <origin> are domains with dots replaced by
// underscores (Token). Replies go to the requester's own inbox prefix
// _INBOX_<origin>.>. In embedded mode (--nats-listen) every directory runs
// a NATS server that only pinned peers can log in to (their nkeys, checked
// against the current peer table without reloading the server; removing
// or re-keying a peer disconnects its live connections); peer P
// may publish only beam.fed.<self>.<P>.* and subscribe only to
// _INBOX_<P>.> (peerPermissions), so it can neither speak for another peer
// nor read anyone's traffic, and never JetStream's or a cluster's subjects
// (reservedSubjects). The directory itself uses an in-process
// connection with no restrictions: it subscribes to beam.fed.<self>.> and
// answers, only into the requesting peer's inbox (a request with any other
// reply subject is refused: the answer goes out with the directory's
// rights). To reach peer P, a directory dials P's server with its own
// nkey. Authorization and permission violations reported by the server are
// logged and counted in beam_federation_rejected_total{reason="permission"
// or "unpinned"}.
//
// With --nats-url the directory uses one connection to an existing NATS
// deployment for both directions instead. Two ways to connect directories
// through it: (1) a shared cluster (or super-cluster) whose operator
// creates one nkey user per directory with the permissions above (each
// directory additionally subscribes to beam.fed.<self>.>), or (2) leaf
// nodes: each directory's NATS joins the hub as a leaf whose user exports
// beam.fed.<peer>.<self>.* and _INBOX_<self>.> and imports
// beam.fed.<self>.> — the subject scheme is the same in every topology.
//
// # Messages
//
// A message is a compact JWS (EdDSA, typ beam-fed+jws, kid = origin
// domain) over a JSON Message. The receiver verifies it against the key
// pinned for the subject's origin (kid must match it), checks from/to/kind
// against the subject, iat/exp freshness (maxClockSkew, maxMessageTTL), and
// records the jti in federation_seen until exp: a replayed envelope is
// dropped (reason "replay"). An invalid message is never answered; it is
// logged and counted by reason. Kinds:
//
//   - intent: the agent's frame verbatim (and, for a beam/2 intent, the
//     sender's JWS, verified by the target and delivered verbatim; the
//     recipient's result JWS comes back in the result), nonce, hop (≤ maxHops) and path
//     (loop detection), timeout, the outbox event id. The target resolves
//     the sender's key from its home directory (resolve, cached KeyTTL),
//     verifies the agent's signature itself (an unsigned frame — a durable
//     send — is accepted as vouched for by the origin's signature, noted
//     vouchedBy, and delivered attested by this directory with auth
//     "peer"), accepts only senders of the origin's domain and
//     recipients of its own, and runs the frame through its own relay
//     (directory.Relay with OriginFederation): its policies, nonce rules
//     and lifecycle. It replies with a signed result only after the
//     outcome is committed in its log.
//   - resolve: asks for the current key of one of the directory's agents.
//   - result: the reply to either (the recipient's result frame, or the
//     target directory's error code and failure frame; delivered says
//     whether the agent got the frame).
//   - notice: reserved (delivery notices for async acceptances).
//
// # Outbox
//
// An intent whose recipient lives in a pinned peer's domain is recorded
// dispatched (transport federation, details.peer) together with a row of
// federation_outbox, in one Log.Do transaction (Forward). The rows follow
// seed 001 exactly: PENDING → CLAIMED (claimed_at, claimed_by, a claim
// token; only when available_at has come) → PUBLISHED (only after the
// peer's signed reply, and only while the claim is still this relay's, in
// the same transaction as the origin's delivered/acked/failed events) |
// PENDING (attempts+1, last_error, backoff in available_at) | DEAD
// (deadline of a waiting sender passed, attempts exhausted, peer unpinned,
// durable age exceeded; a durable intent is recorded dead_letter with
// it). Claims older than ClaimLease are reaped back to PENDING, and at
// start every claim of an earlier process is. The operator replays
// PUBLISHED or DEAD rows to PENDING. Receivers deduplicate on the nonce:
// a republished intent that the target already finished is answered from
// its log (the cached result) and never delivered to the agent again.
//
// Rows of senders that wait (HTTP, WebSocket) carry their deadline and
// retry quickly (RetryBase doubling to SyncRetryMax); rows of durable
// sends (owner bus) retry with backoff up to DurableRetryMax while the peer
// is down and complete when it returns (their messages carry the instant
// the origin admitted the frame, Message.Admitted, against which the
// target checks the frame's replay window, so an outage longer than the
// window loses nothing); retryable failures at the target
// (OFFLINE, TIMEOUT, …) are retried for them too. The bus forwards through
// Forward (the node implements bus.Remote) and is given the bus's outcome callback (Config.BusOutcome),
// called with the nonce after each outcome of a bus-owned row is committed
// (PUBLISHED with delivered/acked/failed, or DEAD with dead_letter).
//
// Every transition of a row is also an event of its intent (details.outbox,
// a Step), in the same transaction: the table is a projection of the log,
// refolded by RebuildOutbox (beam replay), and the steps show in the
// intent's trace. A row whose intent is acked takes no more steps.
//
// The package must not write SQLite except through tracing.Log.Do, must
// not deliver to local agents itself (the directory does), and keeps no
// intent state outside the log and the outbox.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package federation
