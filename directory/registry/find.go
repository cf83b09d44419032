package registry

import (
	"slices"
	"strings"
	"time"
)

// Find returns the Beam IDs of the agents whose ID, display name or org
// contains search, ignoring case (every agent when search is empty), in
// order.
func (r *Registry) Find(search string) []string {
	search = strings.ToLower(search)
	r.mu.RLock()
	ids := make([]string, 0, len(r.agents))
	for id, e := range r.agents {
		if search == "" || strings.Contains(id, search) ||
			strings.Contains(strings.ToLower(e.agent.DisplayName), search) ||
			strings.Contains(strings.ToLower(e.agent.Org), search) {
			ids = append(ids, id)
		}
	}
	r.mu.RUnlock()
	slices.Sort(ids)
	return ids
}

// SeenBefore counts the agents last seen before t.
func (r *Registry) SeenBefore(t time.Time) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n, before := 0, micros(t)
	for _, e := range r.agents {
		if max(e.lastSeen.Load(), micros(e.agent.LastSeen)) < before {
			n++
		}
	}
	return n
}
