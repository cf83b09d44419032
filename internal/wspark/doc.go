// Package wspark keeps idle WebSocket sessions cheap: an idle session holds
// no read buffer and, on Linux, no goroutine.
//
// A server with many connected but idle agents otherwise pays, per
// session, a read buffer and a goroutine blocked in the WebSocket library's
// read (whose stack has grown to what reading and handling a message
// took). Conn wraps the hijacked net.Conn that github.com/coder/websocket
// reads from, so it sits beneath that library: it reads the socket into a
// pooled buffer only once bytes have arrived, and Park lets the session's
// reader give up its goroutine while nothing arrives: the descriptor is
// armed in one process-wide epoll set and a reader is started again when
// the socket becomes readable.
//
// To get the reader back to a short stack after a keepalive round (the
// library reads a pong inside its call for the next message and would go
// on waiting there), Conn follows the RFC 6455 frames it hands out and,
// when the library asks for more right after a control frame and the
// socket has nothing, hands out a synthetic empty binary message, which the
// reader drops (TakeInjected). The same frame tracking counts the peer's
// pongs (Pongs), so a keepalive needs no goroutine waiting for one.
//
// It exists for the idle-session memory benchmark (beam bench
// --idle-agents, RSS per idle agent; docs/BENCHMARKS.md). The trick is
// named "wspark": BEAM_TRICKS_OFF=wspark (or all) turns it off (see
// internal/tricks), and sessions then read through coder/websocket plainly,
// on a plain net.Conn with a goroutine per reader.
//
// It is an internal helper, not a public API.
package wspark
