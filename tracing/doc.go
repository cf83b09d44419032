// Package tracing owns the event log: the append-only table
// intent_trace_events, the lifecycle states and their transition table, the
// single-writer group-commit appender, the projections derived from the log
// (intent_log, beam_messages, beam_mesh), their rebuild, legacy normalization, trace
// queries and live subscriptions from a sequence cursor.
//
// Every state change of an intent is an Event. Events are validated against
// the transition table before they are written, and only reported back to
// the caller once their transaction has committed. The projection rows they
// change are written behind them by the same writer, with the high-water
// mark of the events they hold, and folded again from the log on Open when
// a stop left some unwritten (behind.go).
//
// Every system that keeps state in the log (intents, the bus, jobs,
// pipelines, the federation outbox) declares its lifecycle as a transition
// table (Lifecycle) in its own package and registers it, with the
// projection it folds from its nonces' events if it has one, before it
// first appends (Register, lifecycle.go, owned.go). The writer checks every
// event of a registered owner's nonce against the owner's table too, and
// keeps the owner's projection with its own (written behind, caught up on
// Open, rebuilt by Rebuild). docs/lifecycles.md is rendered from the
// registered tables (Markdown). All SQL on the log's tables lives here, behind the Log's methods with
// typed results (TestNoLogSQLOutsideTracing keeps it so).
//
// In cluster mode (Config.Replicator) the writer hands every committed
// batch to a shipping goroutine, which releases the batch's appenders of
// durable items only once the Replicator stored it; packages write the
// tables that must survive a node as ops (RegisterOp, DoOps), shipped with
// the events; a node that takes a log over imports its batches (Import)
// as its own (replicate.go, batch.go, ops.go, import.go).
//
// tracing must not import any other package of this module: the directory,
// the bus and federation build on it, never the other way round. It knows
// nothing of WebSockets, HTTP, signatures or NATS.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package tracing
