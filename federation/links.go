package federation

import (
	"context"
	"fmt"
	"time"
)

// LinkState is what this directory knows of its link to one peer right
// now, for operators: whether its own NATS connection to the peer is up
// (embedded mode only) and the relay's last failure to publish to it.
type LinkState struct {
	// Peer is the peer's domain.
	Peer string `json:"peer"`
	// Connected reports the NATS connection to the peer; nil when the
	// directory shares one NATS deployment and has no own connection.
	Connected *bool `json:"connected,omitempty"`
	// Failing counts outbox rows for the peer waiting for a retry after a
	// failed publish.
	Failing int64 `json:"failing"`
	// LastError is the newest publish error of those rows.
	LastError string `json:"lastError,omitempty"`
	// LastErrorAt is when that error was recorded.
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
}

// Links returns the link state of every pinned peer.
func (n *Node) Links(ctx context.Context) ([]LinkState, error) {
	trouble, err := n.outbox.failing(ctx)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	out := make([]LinkState, 0, len(n.peers))
	for d, ps := range n.peers {
		l := trouble[d]
		l.Peer = d
		if n.cfg.NATSURL == "" {
			up := ps.conn != nil && ps.conn.IsConnected()
			l.Connected = &up
		}
		out = append(out, l)
	}
	n.mu.Unlock()
	return out, nil
}

// failing sums up, per peer, the pending rows that have failed at least
// once, with the newest error.
func (o *Outbox) failing(ctx context.Context) (map[string]LinkState, error) {
	rows, err := o.log.ReadDB().QueryContext(ctx, `SELECT peer, COUNT(*), MAX(updated_at),
		(SELECT last_error FROM federation_outbox i WHERE i.peer = o.peer AND i.status = 'PENDING' AND i.attempts > 0 ORDER BY updated_at DESC LIMIT 1)
		FROM federation_outbox o WHERE status = 'PENDING' AND attempts > 0 GROUP BY peer`)
	if err != nil {
		return nil, fmt.Errorf("outbox failures: %w", err)
	}
	defer rows.Close()
	out := map[string]LinkState{}
	for rows.Next() {
		var l LinkState
		var at int64
		if err := rows.Scan(&l.Peer, &l.Failing, &at, &l.LastError); err != nil {
			return nil, fmt.Errorf("outbox failures: %w", err)
		}
		l.LastErrorAt = time.UnixMicro(at).UTC()
		out[l.Peer] = l
	}
	return out, rows.Err()
}

// linkDownGrace is how long a link must have been down before
// LinkKnownDown says so: longer than a reconnect to a peer that is up takes.
const linkDownGrace = 2 * time.Second

// LinkKnownDown reports whether this directory's NATS connection to the
// pinned peer was up and has been lost for at least linkDownGrace
// (embedded mode), so that a plain send to one of its agents fails at once
// instead of waiting for its timeout. A link that has not come up since
// the peer was pinned (the peer may not have pinned this directory yet) is
// not known down. It is false with a shared NATS deployment.
func (n *Node) LinkKnownDown(peer string) bool {
	since, wasUp, down := n.linkDownSince(peer)
	return down && wasUp && !since.IsZero() && n.clock().Sub(since) >= linkDownGrace
}

// LinkDown reports whether this directory has no NATS connection to the
// pinned peer right now (embedded mode), so that a sender waiting for one of
// its agents can be told why. It is false when the link is up, when the
// peer is not pinned, and with a shared NATS deployment.
func (n *Node) LinkDown(peer string) bool {
	_, _, down := n.linkDownSince(peer)
	return down
}

// linkDownSince reports whether the link to the pinned peer is down
// (embedded mode), since when (zero when not yet noted) and whether it was
// ever up.
func (n *Node) linkDownSince(peer string) (since time.Time, wasUp, down bool) {
	if n.cfg.NATSURL != "" {
		return time.Time{}, false, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	ps, ok := n.peers[peer]
	if !ok || (ps.conn != nil && ps.conn.IsConnected()) {
		return time.Time{}, false, false
	}
	return ps.downSince, ps.wasUp, true
}
