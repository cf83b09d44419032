package directory

import (
	"github.com/beamdir/beam/agents/wire"
)

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
