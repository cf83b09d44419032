package beamtest

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
	"testing"
)

// Logger returns a logger whose records go to t's output, so they show
// under t with -v and when t fails, instead of on the process's stderr.
// Give it to every component a test starts in-process. Records logged after
// t's cleanups began (a goroutine that outlived its component) are dropped:
// writing to a finished test's output panics.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(t, ""), nil))
}

// LogWriter returns a writer that writes each line written to it to t's
// output, prefixed with prefix (e.g. "node0: "). A partial last line is
// written when t's cleanups begin; from then on, writes are dropped.
func LogWriter(t testing.TB, prefix string) io.Writer {
	w := &testWriter{out: t.Output(), prefix: prefix}
	t.Cleanup(w.close)
	return w
}

// testWriter is LogWriter's writer.
type testWriter struct {
	prefix string

	mu      sync.Mutex
	out     io.Writer // nil once closed
	partial []byte
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.out == nil {
		return len(p), nil
	}
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(w.partial[:i+1])
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) == 0 {
		w.partial = nil
	}
	return len(p), nil
}

// line writes one line (with its newline) to the test's output.
func (w *testWriter) line(b []byte) {
	_, _ = w.out.Write(append([]byte(w.prefix), b...))
}

// close writes what is left of a partial line and drops later writes. It
// runs as one of t's cleanups, before t's output closes.
func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.line(append(w.partial, '\n'))
	}
	w.out, w.partial = nil, nil
}
