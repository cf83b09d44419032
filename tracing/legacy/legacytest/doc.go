// Package legacytest builds legacy Beam TypeScript databases for tests: the
// documented schemas of the directory (intent_log, intent_trace_events) and
// the bus (beam_messages), filled with representative rows — old statuses,
// legacy trace stages, every bus status — and with malformed rows that an
// import must reject. It also says what an import of each row should give.
//
// It is a test helper: it writes only the file it is asked to build.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package legacytest
