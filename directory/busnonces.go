package directory

import (
	"context"
	"time"

	"github.com/beamdir/beam/tracing"
)

// The relay records a new nonce optimistically: it appends received without
// reading the log first, and a nonce the log already has refuses that
// append. The one state that does not refuse it is received itself
// (received → received is an annotation), and the directory never leaves a
// nonce of its own in received: it writes received together with the next
// step. Only the message bus keeps nonces in received (between recording a
// message and its first attempt), and it claims every nonce it records
// through ClaimBusNonce first. So the directory remembers those nonces, and
// the ones Recover found in received, and looks them up before recording a
// frame with one of them. A nonce leaves the set when the bus hands it to
// Deliver (dispatched is then recorded) or when a prune finds that it
// is no longer in received.

// busRecvMinLimit is the set's size that starts the first prune.
const busRecvMinLimit = 1024

// noteBusReceived remembers that nonce may be held in received by the bus.
// d.mu must be held.
func (d *Directory) noteBusReceived(nonce string) {
	if d.busRecv == nil {
		d.busRecv = map[string]uint64{}
	}
	d.busRecvGen++
	d.busRecv[nonce] = d.busRecvGen
	if len(d.busRecv) > max(d.busRecvLimit, busRecvMinLimit) && !d.busRecvPruning && !d.closed {
		d.busRecvPruning = true
		d.wg.Add(1)
		go d.pruneBusReceived()
	}
}

// forgetBusReceived drops nonce from the set: it left received for good.
func (d *Directory) forgetBusReceived(nonce string) {
	d.mu.Lock()
	delete(d.busRecv, nonce)
	d.mu.Unlock()
}

// pruneBusReceived drops the nonces that are no longer in received. An
// entry noted again while its state was read is kept.
func (d *Directory) pruneBusReceived() {
	defer d.wg.Done()
	type item struct {
		nonce string
		gen   uint64
	}
	d.mu.Lock()
	items := make([]item, 0, len(d.busRecv))
	for n, g := range d.busRecv {
		items = append(items, item{n, g})
	}
	d.mu.Unlock()
	var drop []item
	for _, it := range items {
		select {
		case <-d.stop:
			d.mu.Lock()
			d.busRecvPruning = false
			d.mu.Unlock()
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, ok, err := d.log.State(ctx, it.nonce)
		cancel()
		if err != nil {
			d.lg.Warn("prune bus nonces", "err", err)
			break
		}
		if !ok || st != tracing.Received {
			drop = append(drop, it)
		}
	}
	d.mu.Lock()
	for _, it := range drop {
		if _, claimed := d.claims[it.nonce]; !claimed && d.busRecv[it.nonce] == it.gen {
			delete(d.busRecv, it.nonce)
		}
	}
	// Entries that really are in received stay; grow the limit so that they
	// are not read again at every note.
	d.busRecvLimit = max(busRecvMinLimit, 2*len(d.busRecv))
	d.busRecvPruning = false
	d.mu.Unlock()
}
