package directory

import (
	"time"
)

// Recording delivered. A session writer writes a frame and hands the
// intent to the directory's delivered recorder without waiting; the
// recorder has the delivered events of many intents (of every session)
// appended by the owners of their nonces (Owner.Delivered: the directory
// for the intents it relays, the bus, the pipeline gateway), one call per
// owner, DeliveredDelay after the oldest of them was written. A result (or
// a timeout) that settles an intent whose delivered is still queued takes
// it out of the queue, and the settling caller (the owner) appends
// delivered together with acked or failed: one append instead of two for a recipient
// that answers quickly. A settle that finds the frame still being written
// waits for the write, and queueDelivered hands delivered to it in the same
// way (a recipient on a fast link often answers before the session writer
// has returned from its write). A settle that finds delivered being
// recorded waits for that commit. Either way delivered precedes the
// intent's outcome in the log.

// deliveredChunk is the most delivered events of one append.
const deliveredChunk = 512

// deliveredFlushCount is the queue length that is recorded without waiting
// for DeliveredDelay.
const deliveredFlushCount = 256

// delivState is the recorder's state, guarded by Directory.mu.
type delivState struct {
	queue   []*inflight
	since   time.Time // when the oldest queued entry was queued
	started bool      // the recorder goroutine runs (or ran)
	closing bool      // Close: record what is queued and exit
	stopped bool      // the recorder exited: record synchronously
	kick    chan struct{}
}

// kickDelivered wakes the recorder.
func (d *Directory) kickDelivered() {
	select {
	case d.deliv.kick <- struct{}{}:
	default:
	}
}

// queueDelivered hands intents whose frames were written to the recorder,
// or to the settle that waits for one (see the top of this file). It does
// not wait for the commit.
func (d *Directory) queueDelivered(infs []*inflight) {
	if len(infs) == 0 {
		return
	}
	d.mu.Lock()
	rest := infs[:0]
	for _, inf := range infs {
		if inf.finished {
			// Settled while it was written: the settle waits on
			// deliveredCh and records delivered with its own events.
			inf.handDelivered()
			continue
		}
		rest = append(rest, inf)
	}
	infs = rest
	if len(infs) == 0 {
		d.mu.Unlock()
		return
	}
	if d.deliv.stopped || d.deliv.closing && !d.deliv.started {
		d.mu.Unlock()
		d.recordDelivered(infs)
		return
	}
	if !d.deliv.started {
		d.deliv.started = true
		d.wg.Add(1)
		go d.deliveredLoop()
	}
	if len(d.deliv.queue) == 0 {
		d.deliv.since = time.Now()
	}
	for _, inf := range infs {
		inf.delivQueued = true
		d.deliv.queue = append(d.deliv.queue, inf)
	}
	d.mu.Unlock()
	d.kickDelivered()
}

// deliveredLoop is the recorder goroutine.
func (d *Directory) deliveredLoop() {
	defer d.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var spare []*inflight
	for {
		d.mu.Lock()
		if len(d.deliv.queue) == 0 {
			if d.deliv.closing {
				d.deliv.stopped = true
				d.mu.Unlock()
				return
			}
			d.mu.Unlock()
			<-d.deliv.kick
			continue
		}
		wait := time.Until(d.deliv.since.Add(d.cfg.DeliveredDelay))
		if !d.deliv.closing && len(d.deliv.queue) < deliveredFlushCount && wait > 0 {
			d.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-d.deliv.kick:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		queue := d.deliv.queue
		d.deliv.queue = spare[:0]
		batch := queue[:0]
		for _, inf := range queue {
			if inf.delivQueued { // not taken by a settle
				inf.delivQueued = false
				batch = append(batch, inf)
			}
		}
		d.mu.Unlock()
		d.recordDelivered(batch)
		clear(queue)
		spare = queue[:0]
		if cap(spare) > 4*deliveredFlushCount {
			spare = nil
		}
	}
}

// stopDelivered makes the recorder record what is queued and exit; later
// deliveries are recorded synchronously. Close calls it once no session
// is left.
func (d *Directory) stopDelivered() {
	d.mu.Lock()
	d.deliv.closing = true
	d.mu.Unlock()
	d.kickDelivered()
}

// recordDelivered has delivered committed for infs by their owners (in
// chunks of at most deliveredChunk events), then wakes anyone waiting in
// settle.
func (d *Directory) recordDelivered(infs []*inflight) {
	if len(infs) == 0 {
		return
	}
	ok := make([]bool, len(infs))
	// Group by owner, keeping each owner's order.
	type group struct {
		owner Owner
		idx   []int
	}
	var groups []group
next:
	for i, inf := range infs {
		o := inf.owner(d)
		for g := range groups {
			if groups[g].owner == o {
				groups[g].idx = append(groups[g].idx, i)
				continue next
			}
		}
		groups = append(groups, group{owner: o, idx: []int{i}})
	}
	ws := make([]Written, 0, min(len(infs), deliveredChunk))
	for _, g := range groups {
		for start := 0; start < len(g.idx); start += deliveredChunk {
			part := g.idx[start:min(start+deliveredChunk, len(g.idx))]
			ws = ws[:0]
			for _, i := range part {
				ws = append(ws, infs[i].written())
			}
			err := g.owner.Delivered(ws)
			switch {
			case err == nil:
				for _, i := range part {
					ok[i] = true
				}
			case len(part) > 1:
				// One bad nonce rejects the whole call; record the others alone.
				for k, i := range part {
					if e := g.owner.Delivered(ws[k : k+1]); e == nil {
						ok[i] = true
					} else {
						d.lg.Warn("record delivered", "nonce", ws[k].Nonce, "err", e)
					}
				}
			default:
				d.lg.Warn("record delivered", "nonce", ws[0].Nonce, "err", err)
			}
		}
	}
	d.mu.Lock()
	for i, inf := range infs {
		inf.delivering = false
		inf.delivered = ok[i]
		close(inf.deliveredCh)
	}
	d.mu.Unlock()
}

// owner is who appends inf's delivered: the owner of the Delivery, or the
// directory for the nonces it relays.
func (inf *inflight) owner(d *Directory) Owner {
	if inf.owned != nil && inf.owned.del.Owner != nil {
		return inf.owned.del.Owner
	}
	return ownDelivered{d}
}
