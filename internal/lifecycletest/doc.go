// Package lifecycletest is the property test every registered lifecycle
// runs (tracing.Register): random operation sequences, appended through the
// log, never leave an illegal transition in the log, and a full rebuild of
// the projections equals what the appender wrote incrementally. Only tests
// import it.
//
// It is an internal helper, not a public API.
package lifecycletest
