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
	// live holds each envelope's latest live progress report, so that a
	// stream opened while the actor works starts from it; an entry counts
	// only while its LastSeq is the envelope's (a logged change drops it).
	live map[string]tracing.MeshRow
}

// maxLive bounds the live progress reports kept for streams yet to open.
const maxLive = 4096

func newHub(m *metrics) *hub {
	return &hub{m: m, subs: map[string]map[*subscriber]struct{}{}, live: map[string]tracing.MeshRow{}}
}

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

// progress keeps and publishes row, a logged row with a live progress
// above its own.
func (h *hub) progress(row tracing.MeshRow) {
	h.mu.Lock()
	if _, ok := h.live[row.ID]; !ok && len(h.live) >= maxLive {
		for id := range h.live {
			delete(h.live, id)
			break
		}
	}
	h.live[row.ID] = row
	h.mu.Unlock()
	h.publish(liveEvent{row: &row, progress: true})
}

// liveProgress returns envelope id's latest live progress report.
func (h *hub) liveProgress(id string) (tracing.MeshRow, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	row, ok := h.live[id]
	return row, ok
}

// forget drops envelope id's live progress: a logged change supersedes it.
func (h *hub) forget(id string) {
	h.mu.Lock()
	delete(h.live, id)
	h.mu.Unlock()
}

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
