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
// Every query on these tables lives here, behind the Log's methods with
// typed results (Intent, Messages, MessageState, WaitingMessages, …); no other
// package holds SQL on them (TestNoLogSQLOutsideTracing), so their indexes
// and the single writer stay this package's to keep.
//
// tracing must not import any other package of this module: the directory,
// the bus and federation build on it, never the other way round. It knows
// nothing of WebSockets, HTTP, signatures or NATS.
package tracing
