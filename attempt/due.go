package attempt

import (
	"container/heap"
	"time"
)

// Due orders keys by the time they are due: retries that wait, leases that
// expire, deadlines. Each key is in it at most once. The zero value is
// ready to use; it is not safe for concurrent use (its owner's lock guards
// it).
type Due[K comparable] struct {
	h dueHeap[K]
	i map[K]int // key → index in h
}

type dueItem[K comparable] struct {
	key K
	at  time.Time
	seq uint64 // insertion order among equal times
}

type dueHeap[K comparable] struct {
	items []dueItem[K]
	owner *Due[K]
	seq   uint64
}

func (h *dueHeap[K]) Len() int { return len(h.items) }
func (h *dueHeap[K]) Less(a, b int) bool {
	x, y := &h.items[a], &h.items[b]
	if !x.at.Equal(y.at) {
		return x.at.Before(y.at)
	}
	return x.seq < y.seq
}
func (h *dueHeap[K]) Swap(a, b int) {
	h.items[a], h.items[b] = h.items[b], h.items[a]
	h.owner.i[h.items[a].key] = a
	h.owner.i[h.items[b].key] = b
}
func (h *dueHeap[K]) Push(x any) {
	it := x.(dueItem[K])
	h.owner.i[it.key] = len(h.items)
	h.items = append(h.items, it)
}
func (h *dueHeap[K]) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.owner.i, it.key)
	return it
}

func (d *Due[K]) init() {
	if d.i == nil {
		d.i = map[K]int{}
		d.h.owner = d
	}
}

// Set makes key due at at, moving it when it is already in.
func (d *Due[K]) Set(key K, at time.Time) {
	d.init()
	if i, ok := d.i[key]; ok {
		d.h.items[i].at = at
		heap.Fix(&d.h, i)
		return
	}
	d.h.seq++
	heap.Push(&d.h, dueItem[K]{key: key, at: at, seq: d.h.seq})
}

// Remove takes key out; it reports whether it was in.
func (d *Due[K]) Remove(key K) bool {
	i, ok := d.i[key]
	if !ok {
		return false
	}
	heap.Remove(&d.h, i)
	return true
}

// When returns the time key is due.
func (d *Due[K]) When(key K) (time.Time, bool) {
	i, ok := d.i[key]
	if !ok {
		return time.Time{}, false
	}
	return d.h.items[i].at, true
}

// Next returns the earliest key and its time.
func (d *Due[K]) Next() (K, time.Time, bool) {
	if len(d.h.items) == 0 {
		var zero K
		return zero, time.Time{}, false
	}
	return d.h.items[0].key, d.h.items[0].at, true
}

// PopDue removes and returns, earliest first, up to limit keys due at or
// before now (limit ≤ 0: all of them).
func (d *Due[K]) PopDue(now time.Time, limit int) []K {
	var out []K
	for len(d.h.items) > 0 && !d.h.items[0].at.After(now) && (limit <= 0 || len(out) < limit) {
		out = append(out, heap.Pop(&d.h).(dueItem[K]).key)
	}
	return out
}

// Len is the number of keys in d.
func (d *Due[K]) Len() int { return len(d.h.items) }
