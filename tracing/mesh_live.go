package tracing

import "sync"

// meshLiveMax bounds the rows meshLive holds; envelopes beyond it are read
// from SQLite.
const meshLiveMax = 8192

// meshDoneMax is how many envelopes meshLive keeps after they finish (their
// last status is still read: by the final notification, the client that
// waits for it); older finished ones are read from SQLite.
const meshDoneMax = 1024

// meshLive holds the committed beam_mesh rows of open (and of the most
// recently finished) envelopes by id, so that MeshEnvelope answers the
// pipeline's hot path (several reads per step) without SQL. The writer
// updates it after each commit and before the appenders of that commit
// return, so a reader sees at least what its own appends wrote.
type meshLive struct {
	mu   sync.RWMutex
	rows map[string]MeshRow
	done []string // finished ids in rows, oldest first
}

// update stores the mesh rows of a committed batch's working entries.
func (c *meshLive) update(work map[string]*entry) {
	locked := false
	for _, e := range work {
		if e.mesh == nil || e.mesh.ID == "" {
			continue
		}
		if !locked {
			c.mu.Lock()
			locked = true
			if c.rows == nil {
				c.rows = make(map[string]MeshRow)
			}
		}
		prev, ok := c.rows[e.mesh.ID]
		switch {
		case ok && prev.Status.Terminal():
			c.rows[e.mesh.ID] = *e.mesh // a late annotation of a finished one
		case e.mesh.Status.Terminal():
			c.rows[e.mesh.ID] = *e.mesh
			c.done = append(c.done, e.mesh.ID)
			if len(c.done) > meshDoneMax {
				delete(c.rows, c.done[0])
				c.done = append(c.done[:0], c.done[1:]...)
			}
		case ok || len(c.rows) < meshLiveMax:
			c.rows[e.mesh.ID] = *e.mesh
		}
	}
	if locked {
		c.mu.Unlock()
	}
}

func (c *meshLive) get(id string) (MeshRow, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.rows[id]
	return m, ok
}

// reset forgets every row (after a rebuild of the projections).
func (c *meshLive) reset() {
	c.mu.Lock()
	clear(c.rows)
	c.done = c.done[:0]
	c.mu.Unlock()
}
