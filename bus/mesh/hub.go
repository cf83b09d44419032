package mesh

import (
	"encoding/json"
	"sync"

	"github.com/beamdir/beam/tracing"
)

// subBuffer bounds the events waiting for one subscriber.
const subBuffer = 64

// liveEvent is one event for an SSE subscriber: a status snapshot (Row set)
// or an ephemeral FLY event (Fly set).
type liveEvent struct {
	row *tracing.MeshRow
	fly json.RawMessage
	// progress: row is a live progress report on top of the logged row of
	// the same LastSeq (Engine.Processing), not a logged change.
	progress bool
}

// subscriber is one SSE stream of one envelope.
type subscriber struct {
	ch     chan liveEvent
	done   chan struct{}
	once   sync.Once
	lagged bool // guarded by hub.mu
}

func (s *subscriber) close() { s.once.Do(func() { close(s.done) }) }

// hub fans live events of envelopes out to their subscribers. Nothing in it
// is durable: status events are also in the log (a subscriber that falls
// behind is closed and resumes from Last-Event-ID), FLY events are not.
type hub struct {
	m    *metrics
	mu   sync.Mutex
	subs map[string]map[*subscriber]struct{}
}

func newHub(m *metrics) *hub { return &hub{m: m, subs: map[string]map[*subscriber]struct{}{}} }

func (h *hub) subscribe(id string) *subscriber {
	s := &subscriber{ch: make(chan liveEvent, subBuffer), done: make(chan struct{})}
	h.mu.Lock()
	if h.subs[id] == nil {
		h.subs[id] = map[*subscriber]struct{}{}
	}
	h.subs[id][s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(id string, s *subscriber) {
	h.mu.Lock()
	delete(h.subs[id], s)
	if len(h.subs[id]) == 0 {
		delete(h.subs, id)
	}
	h.mu.Unlock()
	s.close()
}

func (h *hub) has(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[id]) > 0
}

// status publishes a row snapshot; a subscriber whose buffer is full is
// closed (it resumes from the log).
func (h *hub) status(row tracing.MeshRow) { h.publish(liveEvent{row: &row}) }

// progress publishes row, a logged row with a live progress above its own.
func (h *hub) progress(row tracing.MeshRow) { h.publish(liveEvent{row: &row, progress: true}) }

func (h *hub) publish(ev liveEvent) {
	row := ev.row
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[row.ID] {
		select {
		case s.ch <- ev:
		default:
			if !s.lagged {
				s.lagged = true
				h.m.lagged.Inc()
				s.close()
			}
		}
	}
}

// fly publishes an ephemeral event; it is dropped (and counted) for every
// subscriber whose buffer is full. It reports how many subscribers got it.
func (h *hub) fly(id string, data json.RawMessage) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for s := range h.subs[id] {
		select {
		case s.ch <- liveEvent{fly: data}:
			n++
		default:
			h.m.flyDropped.Inc()
		}
	}
	return n
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.subs {
		for s := range set {
			s.close()
		}
	}
}
