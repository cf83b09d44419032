package tracing

import (
	"context"
	"sync"
)

// defaultSubscriptionBuffer is the buffer of a subscription created with a
// non-positive buffer; maxSubscriptionBuffer caps it.
const (
	defaultSubscriptionBuffer = 4096
	maxSubscriptionBuffer     = 1 << 20
	catchUpPage               = 512
)

// Subscription delivers committed events in seq order: first those already
// in the log after the starting cursor, then new commits as they happen,
// with no gap and no duplicate. It never blocks the writer: when the
// reader falls more than its buffer behind, the subscription ends with
// ErrSubscriberLagged after delivering what it holds.
type Subscription struct {
	l      *Log
	ctx    context.Context
	cancel context.CancelFunc
	parent context.Context
	out    chan Event
	notify chan struct{}
	done   chan struct{}
	limit  int

	mu         sync.Mutex // guards the fields below; taken after Log.subMu
	queue      [][]Event
	queued     int
	catchingUp bool
	dropped    bool // overflow while catching up: catch up again from the database
	lagged     bool // overflow while live: end with ErrSubscriberLagged
	liveFrom   int64
	stopErr    error
	userClosed bool
	err        error
}

// Subscribe returns a subscription to the events with seq > fromSeq. buffer
// bounds, in events, how far the reader may fall behind live commits
// (defaultSubscriptionBuffer when ≤ 0); a buffer smaller than a commit batch
// lags on that batch. The subscription ends when ctx ends, on Close, when
// the log closes (errClosed) or when the reader lags (ErrSubscriberLagged);
// to resume, subscribe again from the last seq received. Events share their
// Details maps and slices with other readers: treat them as read-only.
func (l *Log) Subscribe(ctx context.Context, fromSeq int64, buffer int) *Subscription {
	if buffer <= 0 {
		buffer = defaultSubscriptionBuffer
	}
	buffer = min(buffer, maxSubscriptionBuffer)
	s := &Subscription{
		l:          l,
		parent:     ctx,
		out:        make(chan Event, min(buffer, 64)),
		notify:     make(chan struct{}, 1),
		done:       make(chan struct{}),
		limit:      buffer,
		catchingUp: true,
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	l.subMu.Lock()
	if l.subsDone {
		l.subMu.Unlock()
		s.err = errClosed
		s.cancel()
		close(s.out)
		close(s.done)
		return s
	}
	l.subs[s] = struct{}{}
	l.subCount.Add(1)
	// Every commit after this point is pushed to s; everything up to
	// liveFrom is read from the database.
	s.liveFrom = l.lastSeq.Load()
	l.subWG.Add(1)
	l.subMu.Unlock()
	go s.run(fromSeq)
	return s
}

// Events returns the channel of events. It is closed when the subscription
// ends; Err then says why.
func (s *Subscription) Events() <-chan Event { return s.out }

// Err returns why the subscription ended: ErrSubscriberLagged, errClosed,
// the context's error, a read error, or nil after Close. It is nil while
// the subscription runs.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the subscription and waits for its goroutine to finish.
func (s *Subscription) Close() {
	s.mu.Lock()
	s.userClosed = true
	s.mu.Unlock()
	s.cancel()
	<-s.done
}

// Done is closed when the subscription has ended.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// stop ends the subscription with err (used by Log.Close).
func (s *Subscription) stop(err error) {
	s.mu.Lock()
	if s.stopErr == nil {
		s.stopErr = err
	}
	s.mu.Unlock()
	s.cancel()
}

// push hands a committed batch to the subscription. Called by the writer
// with l.subMu held; never blocks.
func (s *Subscription) push(batch []Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lagged || s.dropped {
		return
	}
	if s.queued+len(batch) > s.limit {
		if s.catchingUp {
			s.dropped = true
			s.queue, s.queued = nil, 0
			return
		}
		s.lagged = true
	} else {
		s.queue = append(s.queue, batch)
		s.queued += len(batch)
	}
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// publish hands a committed batch to every subscriber.
func (l *Log) publish(batch []Event) {
	l.subMu.Lock()
	for s := range l.subs {
		s.push(batch)
	}
	l.subMu.Unlock()
}

func (s *Subscription) run(fromSeq int64) {
	var err error
	defer func() {
		s.l.subMu.Lock()
		delete(s.l.subs, s)
		s.l.subCount.Add(-1)
		s.l.subMu.Unlock()
		s.mu.Lock()
		switch {
		case s.stopErr != nil:
			err = s.stopErr
		case s.userClosed:
			err = nil
		case err == nil && s.parent.Err() != nil:
			err = s.parent.Err()
		}
		s.err = err
		s.mu.Unlock()
		s.cancel()
		close(s.out)
		close(s.done)
		s.l.subWG.Done()
	}()
	cursor := fromSeq
	send := func(ev Event) bool {
		if ev.Seq <= cursor {
			return true
		}
		select {
		case s.out <- ev:
			cursor = ev.Seq
			return true
		case <-s.ctx.Done():
			return false
		}
	}

	// Catch up from the database until the live queue holds the rest.
	for {
		s.mu.Lock()
		target := s.liveFrom
		s.mu.Unlock()
		for cursor < target {
			evs, rerr := s.l.readEvents(s.ctx, cursor, target, catchUpPage)
			if rerr != nil {
				if s.ctx.Err() == nil {
					err = rerr
				}
				return
			}
			if len(evs) == 0 {
				break
			}
			for _, ev := range evs {
				if !send(ev) {
					return
				}
			}
		}
		s.l.subMu.Lock()
		s.mu.Lock()
		if s.dropped {
			s.dropped = false
			s.liveFrom = s.l.lastSeq.Load()
			s.mu.Unlock()
			s.l.subMu.Unlock()
			continue
		}
		s.catchingUp = false
		s.mu.Unlock()
		s.l.subMu.Unlock()
		break
	}

	// Live.
	for {
		s.mu.Lock()
		q, lagged := s.queue, s.lagged
		s.queue, s.queued = nil, 0
		s.mu.Unlock()
		for _, b := range q {
			for _, ev := range b {
				if !send(ev) {
					return
				}
			}
		}
		if lagged {
			err = ErrSubscriberLagged
			return
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-s.notify:
		case <-s.ctx.Done():
			return
		}
	}
}
