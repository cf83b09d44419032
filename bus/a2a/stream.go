package a2a

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/internal/sse"
	"github.com/beamdir/beam/tracing"
)

// stream writes a task's stream as Server-Sent Events; wrap turns one
// stream response (its member name and value) into the event's data.
type stream struct {
	out  *sse.Writer
	f    http.Flusher
	v    version
	wrap func(member string, v any) any
}

func newStream(w http.ResponseWriter, v version, wrap func(string, any) any) (*stream, error) {
	f, ok := w.(http.Flusher)
	if !ok {
		return nil, errors.New("streaming unsupported")
	}
	longLived(w)
	sse.Open(w, "no-cache")
	return &stream{out: sse.NewWriter(w), f: f, v: v, wrap: wrap}, nil
}

func (s *stream) event(member string, v any) {
	if s.out.Err() != nil {
		return
	}
	b, err := json.Marshal(s.wrap(member, v))
	if err != nil {
		s.out.Fail(fmt.Errorf("encode stream event: %w", err))
		return
	}
	if s.out.Event("", "", b); s.out.Err() == nil {
		s.f.Flush()
	}
}

func (s *stream) comment() {
	if s.out.Comment("keepalive"); s.out.Err() == nil {
		s.f.Flush()
	}
}

func (s *stream) err() error { return s.out.Err() }

// longLived lifts the server's write deadline from a response that lasts
// as long as its task (a stream, a blocking send): the task's own deadline
// bounds it, and streams carry keepalives.
func longLived(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
}

// follow streams task row: the task first, then a status update for every
// change of status or progress, each FLY event as a chunk of the
// "partial" artifact, and at the end the final payload as the "result"
// artifact and the final status. It returns when the task ends or waits
// for input, when ctx ends or the client goes away.
func (s *Server) follow(ctx context.Context, out *stream, row tracing.MeshRow) {
	v := out.v
	w := s.cfg.Mesh.Watch(row.ID)
	defer func() { w.Close() }()
	if cur, ok, err := s.cfg.Mesh.Envelope(ctx, row.ID); err == nil && ok {
		row = cur
	}
	out.event("task", taskOf(v, row, true))
	if settled(row) {
		return
	}
	_, headers, _ := mesh.Payload(row)
	ctxID := contextOf(row, headers)
	last := row
	flies := 0
	for out.err() == nil {
		nctx, cancel := context.WithTimeout(ctx, s.cfg.KeepaliveInterval)
		next, fly, err := w.Next(nctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			out.comment()
			continue
		}
		if errors.Is(err, mesh.ErrWatchLagged) {
			// Fell behind: read the row again and follow anew.
			w.Close()
			w = s.cfg.Mesh.Watch(row.ID)
			cur, ok, err := s.cfg.Mesh.Envelope(ctx, row.ID)
			if err != nil || !ok {
				return
			}
			next = &cur
		} else if err != nil {
			return
		}
		if fly != nil {
			out.event("artifactUpdate", artifactUpdate{Kind: v.kind("artifact-update"), TaskID: row.ID, ContextID: ctxID,
				Artifact: artifact{ArtifactID: partialArtifact, Name: "partial", Description: "partial output streamed by the actors",
					Parts: []part{dataPart(v, fly)}}, Append: flies > 0})
			flies++
			continue
		}
		if next == nil || next.LastSeq < last.LastSeq {
			continue
		}
		cur := *next
		if cur.Status == last.Status && cur.Progress <= last.Progress && !settled(cur) {
			last = cur
			continue
		}
		if cur.Status == tracing.MeshSucceeded {
			if payload, _, err := mesh.Payload(cur); err == nil {
				a := artifactUpdate{Kind: v.kind("artifact-update"), TaskID: row.ID, ContextID: ctxID,
					Artifact: resultOf(v, payload), LastChunk: true}
				out.event("artifactUpdate", a)
			}
		}
		up := statusUpdate{Kind: v.kind("status-update"), TaskID: row.ID, ContextID: ctxID,
			Status: statusOfRow(v, cur, ctxID), Metadata: metadataOf(cur, headers)}
		if v == v03 {
			final := settled(cur)
			up.Final = &final
		}
		out.event("statusUpdate", up)
		last = cur
		if settled(cur) {
			return
		}
	}
}
