package directory

import (
	"github.com/beamdir/beam/agents/wire"
)

// DeliverDirect POSTs f to an agent's direct HTTP endpoint exactly as the
// directory's own direct-HTTP path does (same body, headers, timeout and
// response mapping) and returns the recipient's result. Nothing is
// recorded: the caller (the pipeline router) owns the nonce's lifecycle.
func (d *Directory) DeliverDirect(f *wire.IntentFrame, endpoint string) (*wire.ResultFrame, error) {
	inf := &inflight{nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, origin: TransportBus,
		start: d.clock()}
	return d.postDirect(inf, f, endpoint)
}
