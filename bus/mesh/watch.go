package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/beamdir/beam/tracing"
)

// ErrWatchLagged is returned by Watcher.Next when the watcher fell behind
// and was closed: read the envelope again and watch it anew.
var ErrWatchLagged = errors.New("mesh: watcher fell behind")

// Watcher follows one envelope's live events, as the gateway's SSE stream
// does: status snapshots and ephemeral FLY events.
type Watcher struct {
	e   *Engine
	id  string
	sub *subscriber
}

// Watch starts following envelope id. Subscribe before reading the
// envelope's current row, so that no change falls between the two; Close
// the watcher when done.
func (e *Engine) Watch(id string) *Watcher {
	return &Watcher{e: e, id: id, sub: e.hub.subscribe(id)}
}

// Next waits for the next event: a status snapshot (row) or a FLY event
// (fly). It returns ctx's error when ctx ends, and ErrWatchLagged when the
// watcher fell behind or the engine stopped.
func (w *Watcher) Next(ctx context.Context) (row *tracing.MeshRow, fly json.RawMessage, err error) {
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-w.sub.done:
		return nil, nil, ErrWatchLagged
	case ev := <-w.sub.ch:
		return ev.row, ev.fly, nil
	}
}

// Close stops following the envelope.
func (w *Watcher) Close() { w.e.hub.unsubscribe(w.id, w.sub) }

// Envelope returns envelope id's row from the log.
func (e *Engine) Envelope(ctx context.Context, id string) (tracing.MeshRow, bool, error) {
	return e.log.MeshEnvelope(ctx, id)
}

// Envelopes lists envelopes matching q, newest first, with the total count.
func (e *Engine) Envelopes(ctx context.Context, q tracing.MeshQuery) ([]tracing.MeshRow, int64, error) {
	return e.log.MeshEnvelopes(ctx, q)
}

// Payload returns the current payload of an envelope's row (the final
// payload once it succeeded) and its headers.
func Payload(row tracing.MeshRow) (json.RawMessage, map[string]string, error) {
	env, err := envelopeOf(row)
	if err != nil {
		return nil, nil, err
	}
	return env.Payload, env.Headers, nil
}

// Follow reads envelope id and then follows its changes, calling each with
// the row first and after every change, until each returns true (and
// Follow returns that row) or ctx ends. A watcher that falls behind reads
// the row again, so no change is skipped for good.
func (e *Engine) Follow(ctx context.Context, id string, each func(tracing.MeshRow) (stop bool)) (tracing.MeshRow, error) {
	var row tracing.MeshRow
	for {
		w := e.Watch(id)
		cur, ok, err := e.Envelope(ctx, id)
		if err != nil || !ok {
			w.Close()
			if err == nil {
				err = fmt.Errorf("mesh: no envelope %s", id)
			}
			return row, err
		}
		if cur.LastSeq >= row.LastSeq {
			row = cur
		}
		if each(row) {
			w.Close()
			return row, nil
		}
		for {
			next, _, err := w.Next(ctx)
			if errors.Is(err, ErrWatchLagged) {
				break
			}
			if err != nil {
				w.Close()
				return row, err
			}
			if next == nil || next.LastSeq < row.LastSeq {
				continue
			}
			row = *next
			if each(row) {
				w.Close()
				return row, nil
			}
		}
		w.Close()
	}
}
