package mesh

import (
	"context"
	"fmt"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// A hop to an actor of a peer directory is an intent of its own nonce
// (directory.PathPeer). Each attempt of a hop has one such nonce, recorded in the
// attempt's dispatched event (details.extra.peerNonce). When the attempt is
// started again because a restart interrupted it (Recover counts the
// attempt back), the same nonce and the same frame are relayed again: the
// peer deduplicates on the nonce (a hop it finished is answered from its
// log and not delivered to the actor again; one still in progress is
// answered IN_PROGRESS and asked again by the outbox), and this
// directory's own record of the nonce answers a hop whose outcome it
// committed before the restart. A retry by the actor's policy is a new
// attempt with a new nonce, and so is the next attempt after a recorded
// frame was refused for being older than the replay window.

// peerHop returns the nonce and, when this directory recorded it, the
// frame of attempt n of row's current hop to a peer directory: those of an
// earlier dispatch of the same attempt, or a new nonce and a nil frame.
func (e *Engine) peerHop(ctx context.Context, row tracing.MeshRow, n int) (string, *wire.IntentFrame, error) {
	evs, err := e.log.Trace(ctx, row.Nonce)
	if err != nil {
		return "", nil, fmt.Errorf("read the trace of envelope %s: %w", row.ID, err)
	}
	nonce := redispatchedNonce(evs, n)
	if nonce == "" {
		return wire.NewNonce(), nil, nil
	}
	hop, err := e.log.Trace(ctx, nonce)
	if err != nil {
		return "", nil, fmt.Errorf("read the trace of hop intent %s: %w", nonce, err)
	}
	for _, ev := range hop {
		if len(ev.Details.Frame) == 0 {
			continue
		}
		f, err := wire.DecodeIntentFrame(ev.Details.Frame)
		if err != nil || f.Nonce != nonce {
			// Not the frame of this hop: never relay it under the nonce.
			return wire.NewNonce(), nil, nil
		}
		return nonce, f, nil
	}
	// Interrupted before the directory recorded the intent: the peer has
	// never seen the nonce.
	return nonce, nil, nil
}

// redispatchedNonce returns the peer nonce of attempt n of the current hop
// when the envelope's events (its trace) show that attempt dispatched
// before, with no outcome since: the last dispatch is of attempt n and no
// step other than a wait (a restart, an offline actor), a pause, a resume
// or a takeover's marker followed it. It
// returns "" otherwise.
func redispatchedNonce(evs []tracing.Event, n int) string {
	nonce := ""
	for _, ev := range evs {
		if len(ev.Details.Mesh) == 0 {
			continue
		}
		st, err := tracing.DecodeMeshStep(ev.Details.Mesh)
		if err != nil {
			continue
		}
		switch {
		case ev.State == tracing.Dispatched && st.Kind == tracing.MeshKindDispatch:
			nonce = ""
			if st.Attempt == n {
				nonce, _ = ev.Details.Extra["peerNonce"].(string)
			}
		case ev.State == tracing.Queued && st.Kind != tracing.MeshKindWait && st.Kind != tracing.MeshKindPause &&
			st.Kind != tracing.MeshKindResume && st.Kind != meshKindTakeover:
			nonce = ""
		case ev.State.Terminal():
			nonce = ""
		}
	}
	return nonce
}
