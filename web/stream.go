package web

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/sse"
	"github.com/beamdir/beam/tracing"
)

const (
	// defaultStreamBuffer is how many events a stream may fall behind the
	// log before it is ended (the browser then resumes with Last-Event-ID).
	defaultStreamBuffer = 4096
	// maxStreamBatch bounds the events written between two flushes.
	maxStreamBatch = 256
)

// streamEvent is the data of one SSE "intent" event: the log event plus
// the intent's current summary.
type streamEvent struct {
	Seq        int64           `json:"seq"`
	Nonce      string          `json:"nonce"`
	State      tracing.State   `json:"state"`
	Bucket     tracing.Bucket  `json:"bucket"`
	At         string          `json:"at"`
	From       string          `json:"from,omitempty"`
	To         string          `json:"to,omitempty"`
	IntentType string          `json:"intentType,omitempty"`
	Transport  string          `json:"transport,omitempty"`
	Attempt    int             `json:"attempt,omitempty"`
	Details    json.RawMessage `json:"details"`
	Intent     *intentView     `json:"intent"`
}

// liteDetails drops the bulky parts of details (frames, results, payloads)
// that the live feed does not show; the trace endpoint has them.
func liteDetails(d tracing.Details) tracing.Details {
	d.Frame, d.Result, d.Response = nil, nil, nil
	if d.Bus != nil {
		b := *d.Bus
		b.Payload, b.Metadata = nil, nil
		d.Bus = &b
	}
	return d
}

func (d *Dashboard) acquireStream() bool {
	d.streamMu.Lock()
	defer d.streamMu.Unlock()
	if d.streams >= maxStreams {
		return false
	}
	d.streams++
	return true
}

func (d *Dashboard) releaseStream() {
	d.streamMu.Lock()
	d.streams--
	d.streamMu.Unlock()
}

// streamStart returns the seq after which the stream starts: Last-Event-ID
// (a reconnecting EventSource), else ?after=, else the current end of the
// log.
func (d *Dashboard) streamStart(r *http.Request) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	name := "Last-Event-ID"
	if v == "" {
		v, name = r.URL.Query().Get("after"), "after"
	}
	last := d.log.LastSeq()
	if v == "" {
		return last, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s must be a non-negative log seq", name)
	}
	// A position beyond the log (a client of an older database) resumes at
	// the end rather than waiting for seqs that may never come.
	return min(n, last), nil
}

func (d *Dashboard) handleStream(w http.ResponseWriter, r *http.Request, _ principal) error {
	from, err := d.streamStart(r)
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
	}
	if !d.acquireStream() {
		e := httpjson.New(http.StatusServiceUnavailable, "TOO_MANY_STREAMS", "too many live streams are open")
		e.RetryAfter = 5 * time.Second
		return e
	}
	defer d.releaseStream()
	ctx := r.Context()
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // the stream outlives any server write timeout
	sse.Open(w, "no-store")
	bw := bufio.NewWriterSize(w, 32<<10)
	out := sse.NewWriter(bw)
	out.Retry(2000)
	out.Comment("stream from seq " + strconv.FormatInt(from, 10))
	if err := flush(bw, rc); err != nil {
		return nil
	}

	buffer := d.streamBuffer
	if buffer <= 0 {
		buffer = defaultStreamBuffer
	}
	sub := d.log.Subscribe(ctx, from, buffer)
	defer sub.Close()
	keep := time.NewTicker(d.cfg.KeepAlive)
	defer keep.Stop()
	batch := make([]tracing.Event, 0, maxStreamBatch)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keep.C:
			out.Comment("keepalive " + strconv.FormatInt(d.clock().Unix(), 10))
			if err := flush(bw, rc); err != nil {
				return nil
			}
		case ev, ok := <-sub.Events():
			if !ok {
				if err := sub.Err(); errors.Is(err, tracing.ErrSubscriberLagged) {
					// End the response; EventSource reconnects with the
					// last id it saw and resumes exactly after it.
					out.Comment("lagged behind the log; reconnect with Last-Event-ID")
					_ = flush(bw, rc)
				} else if err != nil && ctx.Err() == nil {
					d.lg.Warn("dashboard: stream subscription ended", "err", err)
				}
				return nil
			}
			batch = append(batch[:0], ev)
		drain:
			for len(batch) < maxStreamBatch {
				select {
				case ev, ok := <-sub.Events():
					if !ok {
						break drain
					}
					batch = append(batch, ev)
				default:
					break drain
				}
			}
			if err := d.writeBatch(ctx, out, batch); err != nil {
				if ctx.Err() == nil {
					d.lg.Warn("dashboard: stream", "err", err)
				}
				return nil
			}
			if err := flush(bw, rc); err != nil {
				return nil
			}
		}
	}
}

func flush(bw *bufio.Writer, rc *http.ResponseController) error {
	if err := bw.Flush(); err != nil {
		return err
	}
	return rc.Flush()
}

// writeBatch writes the events of batch with the current summaries of
// their intents (read in one query).
func (d *Dashboard) writeBatch(ctx context.Context, out *sse.Writer, batch []tracing.Event) error {
	summaries, err := d.summaries(ctx, batch)
	if err != nil {
		return err
	}
	for _, ev := range batch {
		det, err := json.Marshal(liteDetails(ev.Details))
		if err != nil {
			return fmt.Errorf("encode details of event %d: %w", ev.Seq, err)
		}
		se := streamEvent{
			Seq: ev.Seq, Nonce: ev.Nonce, State: ev.State, Bucket: ev.State.Bucket(), At: isoTime(ev.At),
			From: ev.From, To: ev.To, IntentType: ev.IntentType, Transport: ev.Transport, Attempt: ev.Attempt,
			Details: det, Intent: summaries[ev.Nonce],
		}
		data, err := json.Marshal(se)
		if err != nil {
			return fmt.Errorf("encode event %d: %w", ev.Seq, err)
		}
		out.Event("intent", strconv.FormatInt(ev.Seq, 10), data)
	}
	return nil // a write error shows in the flush that follows
}

func (d *Dashboard) summaries(ctx context.Context, batch []tracing.Event) (map[string]*intentView, error) {
	out := make(map[string]*intentView, len(batch))
	nonces := make([]string, 0, len(batch))
	for _, ev := range batch {
		if _, ok := out[ev.Nonce]; !ok {
			out[ev.Nonce] = nil
			nonces = append(nonces, ev.Nonce)
		}
	}
	rows, err := d.log.IntentsByNonce(ctx, nonces)
	if err != nil {
		return nil, fmt.Errorf("read intent summaries: %w", err)
	}
	for i := range rows {
		v := viewOf(&rows[i], false)
		out[rows[i].Nonce] = &v
	}
	return out, nil
}
