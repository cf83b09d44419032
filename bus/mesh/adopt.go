package mesh

import (
	"context"
	"strings"

	"github.com/beamdir/beam/tracing"
)

// meshKindTakeover is the step that marks an envelope adopted after a
// takeover without moving it (a hop in flight is requeued by a wait step
// instead).
const meshKindTakeover = "takeover"

// Adopt takes over envelopes (ids or their log nonces) that a takeover
// imported into this log from a dead node's log while the engine runs:
// each open one whose latest event is the imported one
// (tracing.Log.Adoptable) is resumed as Recover resumes it at startup — a
// hop the dead node had dispatched is queued again as unknown and
// dispatched again (at least once per hop; the envelope still finishes
// once, as its steps are serialized here), one waiting for an offline
// actor waits here, a queued one keeps its schedule — and gets one event
// of transport tracing.TransportTakeover. An envelope the engine drives or
// adopted already is skipped: calling Adopt again adopts nothing. It
// returns how many envelopes it adopted.
func (e *Engine) Adopt(ctx context.Context, ids []string) (int, error) {
	n, err := tracing.AdoptEach(ids, func(id string) (bool, error) {
		id = strings.TrimPrefix(id, nonceOf(""))
		ok, err := e.adoptOne(ctx, id)
		if ok {
			e.startAttempt(id)
		}
		return ok, err
	})
	if n > 0 {
		e.lg.Info("mesh adopted envelopes", "envelopes", n)
	}
	return n, err
}

// adoptOne adopts envelope id and reports whether it did.
func (e *Engine) adoptOne(ctx context.Context, id string) (bool, error) {
	unlock := e.lock(id)
	defer unlock()
	from, ok, err := e.log.Adoptable(ctx, nonceOf(id))
	if err != nil || !ok {
		return false, err
	}
	row, ok, err := e.log.MeshEnvelope(ctx, id)
	if err != nil || !ok || row.Status.Terminal() {
		return false, err
	}
	if _, err := e.resume(ctx, row, &from); err != nil {
		return false, err
	}
	return true, nil
}
