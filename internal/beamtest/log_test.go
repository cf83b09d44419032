package beamtest

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordingTB is a test whose output and cleanups the test holds.
type recordingTB struct {
	testing.TB
	out      bytes.Buffer
	cleanups []func()
}

func (r *recordingTB) Output() io.Writer { return &r.out }
func (r *recordingTB) Cleanup(fn func()) { r.cleanups = append(r.cleanups, fn) }

// TestLogWriterWritesWholePrefixedLines: lines reach the test's output
// whole and prefixed, however they are split across writes; the partial
// last line is written when the cleanups run, and nothing after (writing
// to the output of a test that ended panics).
func TestLogWriterWritesWholePrefixedLines(t *testing.T) {
	t.Parallel()
	tb := &recordingTB{TB: t}
	w := LogWriter(tb, "node0: ")
	_, _ = io.WriteString(w, "first li")
	require.Empty(t, tb.out.String())
	_, _ = io.WriteString(w, "ne\nsecond\nthi")
	require.Equal(t, "node0: first line\nnode0: second\n", tb.out.String())
	for _, fn := range tb.cleanups {
		fn()
	}
	require.Equal(t, "node0: first line\nnode0: second\nnode0: thi\n", tb.out.String())
	n, err := io.WriteString(w, "late\n")
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, "node0: first line\nnode0: second\nnode0: thi\n", tb.out.String())
}
