package sse

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAppendEventFraming(t *testing.T) {
	require.Equal(t, "event: status\nid: 7\ndata: {}\n\n", string(appendEvent(nil, "status", "7", []byte("{}"))))
	require.Equal(t, "data: {\"a\":1}\n\n", string(appendEvent(nil, "", "", []byte(`{"a":1}`))))
	require.Equal(t, "event: x\ndata: a\ndata: b\ndata: \n\n", string(appendEvent(nil, "x", "", []byte("a\nb\n"))))
}

func TestWriterStream(t *testing.T) {
	var out bytes.Buffer
	s := NewWriter(&out)
	s.Retry(2000)
	s.Comment("stream from seq 3")
	s.Event("intent", "4", []byte(`{"seq":4}`))
	s.Comment("keepalive")
	require.NoError(t, s.Err())
	require.Equal(t, "retry: 2000\n: stream from seq 3\n\nevent: intent\nid: 4\ndata: {\"seq\":4}\n\n: keepalive\n\n", out.String())

	s.Fail(errors.New("encode"))
	s.Event("intent", "5", []byte("{}"))
	require.EqualError(t, s.Err(), "encode")
	require.NotContains(t, out.String(), "id: 5")
}

func TestOpenHeaders(t *testing.T) {
	rec := httptest.NewRecorder()
	Open(rec, "no-cache")
	require.Equal(t, 200, rec.Code)
	require.Equal(t, "text/event-stream", rec.Header().Get("Content-Type"))
	require.Equal(t, "no-cache", rec.Header().Get("Cache-Control"))
	require.Equal(t, "no", rec.Header().Get("X-Accel-Buffering"))
}

func BenchmarkWriterEvent(b *testing.B) {
	s := NewWriter(&bytes.Buffer{})
	data := []byte(`{"id":"e","status":"running","progress":0.5}`)
	b.ReportAllocs()
	for b.Loop() {
		s.w.(*bytes.Buffer).Reset()
		s.Event("status", "12345", data)
	}
}
