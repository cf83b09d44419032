package tracing

import "sync"

// meshLiveMax bounds the rows meshLive holds; envelopes beyond it are read
// from SQLite.
const meshLiveMax = 8192

// meshLive holds the committed beam_mesh rows of open envelopes by id, so
// that MeshEnvelope answers the pipeline's hot path (one read per step)
// without SQL. The writer updates it after each commit and before the
// appenders of that commit return, so a reader sees at least what its own
// appends wrote; a terminal envelope leaves it (and is read from SQLite).
type meshLive struct {
	mu   sync.RWMutex
	rows map[string]MeshRow
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
		if e.mesh.Status.Terminal() {
			delete(c.rows, e.mesh.ID)
		} else if _, ok := c.rows[e.mesh.ID]; ok || len(c.rows) < meshLiveMax {
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
	c.mu.Unlock()
}
