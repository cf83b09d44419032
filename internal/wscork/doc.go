// Package wscork coalesces the frames a WebSocket session writer sends
// together into one socket write.
//
// github.com/coder/websocket flushes every message it writes, so a session
// writer with a batch of queued messages would make one write (one
// syscall, one TCP segment) per frame. Cork sits beneath that library, as
// the writer under its write buffer: while corked, whatever the library
// writes is collected in a pooled buffer and goes out in one write when
// the session writer flushes (under one write deadline). Uncorked it holds
// no buffer and writes pass through, so the library's own write buffer can
// be small (a control frame), which an idle session then does not pay for.
//
// It exists for the WebSocket throughput benchmark (beam bench --mode ws,
// server CPU per intent; docs/BENCHMARKS.md). The trick is named "wscork":
// BEAM_TRICKS_OFF=wscork (or all) turns it off (see internal/tricks), and
// sessions then write through coder/websocket plainly: the server's write
// buffer, one write per frame, each under its own deadline.
//
// It is an internal helper, not a public API.
package wscork
