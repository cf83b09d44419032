// Package legacy reads databases written by the Beam TypeScript reference
// implementation (a directory's intent_log and intent_trace_events tables, a
// message bus's beam_messages table), normalizes their legacy statuses and
// trace stages into the canonical lifecycle states of package tracing, and
// appends them to our log, one atomic append per nonce.
//
// Normalization is pure (normalizeStatus, normalizeBusStatus, normalizeStage)
// and keeps the original labels in Details.LegacyStage and
// Details.LegacyStatus. Import only ever writes sequences that start with
// received and obey tracing.CanTransition; a nonce whose legacy rows cannot
// be made legal, or that holds malformed data, is reported as a RowError and
// not written. Nonces already present in the destination are skipped, so a
// re-import is harmless.
//
// legacy opens the source database read-only and never changes it. It writes
// only through the Appender it is given and must not import any package of
// this module other than tracing.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package legacy
