// Package jobs is the Intent Protocol v2.1 job bus: publishers POST
// intents, pull workers claim them under a lease and an ephemeral claim
// token, then fulfill or fail them; failed and expired claims are requeued
// with exponential backoff until their attempts run out and they go dead
// (the dead-letter queue). It also serves the protocol's results, its
// per-key KV store, HMAC request signing, the admin routes and /metrics, on
// its own listener with the RFC's paths at the root.
//
// # State
//
// Every state change of a job is an event in the beam event log
// (tracing.Log), owner "jobs", nonce "job:<id>", with details.job
// (tracing.JobDetails). Publish writes received+queued, a claim
// dispatched+delivered, an extension delivered again, a fulfill acked, a
// fail or a lease expiry queued (attempts left) or dead_letter, an admin
// retry dead_letter→queued, an admin cancel dead_letter. The package checks
// each change against its own transition table (lifecycle.go) before it
// appends; the log checks the canonical one. The job rows are the fold
// tracing.JobRow.Apply of those events, held in memory and rebuilt from the
// log at every start, together with the claim index: a priority heap per
// namespace and routing group, and the delayed jobs and the leases as
// timers of the attempt engine (attempt.Due), which also gives the requeue
// backoff and the reaper's loop. A claim therefore reads no SQL and writes
// one append.
//
// Tester keys (as SHA-256 digests), KV entries, idempotency records and the
// tombstones of purged or expired jobs are not job lifecycles: they live in
// tables of the same SQLite file (intent_bus_*), written through ops
// (tracing.Log.DoOps, replicated.go) so that in cluster mode they are
// shipped with the log and re-applied by a node that takes it over, and are
// cached in memory (Service.Reload reads them again after such an import).
//
// # What it must not do
//
// It never writes a job's state anywhere but the log, never stores an API
// key or a claim token in clear, never answers an error in another shape
// than {"error":{"code","message"}}, and never imports the directory, the
// message bus or the web dashboard.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package jobs
