package sse

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// Open starts an event stream on w: it sets the Content-Type, the given
// Cache-Control and X-Accel-Buffering: no (so proxies do not hold events
// back), and writes the 200 status line.
func Open(w http.ResponseWriter, cacheControl string) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", cacheControl)
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
}

// appendEvent appends one event to b and returns the extended slice: an
// "event" line when name is not empty, an "id" line when id is not empty,
// one "data" line per line of data, then the blank line that ends the
// event.
func appendEvent(b []byte, name, id string, data []byte) []byte {
	if name != "" {
		b = append(append(append(b, "event: "...), name...), '\n')
	}
	if id != "" {
		b = append(append(append(b, "id: "...), id...), '\n')
	}
	b = append(b, "data: "...)
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		b = append(append(b, data[:i]...), "\ndata: "...)
		data = data[i+1:]
	}
	return append(append(b, data...), "\n\n"...)
}

// Writer writes events to a stream, reusing one buffer. After the first
// write error it writes nothing more; Err returns that error.
type Writer struct {
	w   io.Writer
	buf []byte
	err error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Event writes one event (see appendEvent).
func (s *Writer) Event(name, id string, data []byte) {
	if s.err == nil {
		s.write(appendEvent(s.buf[:0], name, id, data))
	}
}

// Comment writes a comment line ": text" and ends it with a blank line.
func (s *Writer) Comment(text string) {
	if s.err == nil {
		s.write(append(append(append(s.buf[:0], ": "...), text...), "\n\n"...))
	}
}

// Retry writes the retry field: how many milliseconds a client waits
// before it reconnects. It ends no event; a comment or event follows.
func (s *Writer) Retry(ms int) {
	if s.err == nil {
		s.write(append(strconv.AppendInt(append(s.buf[:0], "retry: "...), int64(ms), 10), '\n'))
	}
}

// Fail records err as the stream's error (an event that could not be
// encoded); nothing more is written.
func (s *Writer) Fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Err returns the first error of the stream, or nil.
func (s *Writer) Err() error { return s.err }

func (s *Writer) write(b []byte) {
	s.buf = b
	_, s.err = s.w.Write(b)
}
