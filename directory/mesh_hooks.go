package directory

import (
	"context"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// OriginMesh is the transport of the received event of a pipeline hop that
// the directory relays to a peer directory's agent (RelayToPeer).
const OriginMesh = "mesh"

// DeliverDirect POSTs f to an agent's direct HTTP endpoint exactly as the
// directory's own direct-HTTP path does (same body, headers, timeout and
// response mapping, and the same attestation of an unsigned frame, auth
// saying how its sender was authenticated) and returns the recipient's
// result. Nothing is recorded: the caller (the pipeline router) owns the
// nonce's lifecycle.
func (d *Directory) DeliverDirect(f *wire.IntentFrame, auth, endpoint string) (*wire.ResultFrame, error) {
	inf := &inflight{nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, origin: TransportBus,
		start: d.clock()}
	h, err := d.handOver(f, "", "", auth, "")
	if err != nil {
		return nil, err
	}
	return d.postDirect(inf, h, endpoint)
}

// PeerFor returns the pinned peer directory that serves beamID when it is
// not an agent of this directory (false without federation, or when no
// pinned peer serves its domain).
func (d *Directory) PeerFor(beamID string) (string, bool) {
	r := d.remoteRouter()
	if r == nil {
		return "", false
	}
	if _, local := d.reg.Get(beamID); local && d.reg.Serves(beamID) {
		return "", false
	}
	return r.PeerFor(beamID)
}

// RelayToPeer relays f, an unsigned frame from one of this directory's
// agents whom the caller authenticated (the pipeline router, for a hop
// whose actor lives in a peer directory), to its recipient in a peer
// directory: an intent of its own nonce with its own trace here (received
// with transport mesh, dispatched over federation, then the peer's
// outcome) and at the peer, which accepts the frame as vouched for by this
// directory and delivers it attested. It waits up to timeout and returns
// the recipient's result frame (success or failure) or the relay's error.
func (d *Directory) RelayToPeer(ctx context.Context, f *wire.IntentFrame, timeout time.Duration) (*wire.ResultFrame, *RelayError) {
	res, rerr := d.Relay(ctx, f, RelayOptions{Origin: OriginMesh, allowUnsigned: true, Timeout: timeout})
	if rerr != nil {
		return nil, rerr
	}
	rf, err := wire.DecodeResultFrame(res)
	if err != nil {
		return nil, relayErr(CodeRelayError, f.Nonce, "the peer's result frame cannot be read: %v", err)
	}
	return rf, nil
}
