package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/beamdir/beam/directory"
)

// Router reaches the cluster from the registry (registry.Config.Replicator)
// and the directory (directory.Config.Cluster), which are built before the
// node: the node needs them, and joins its cluster only at Start, which
// points the router at it (Config.Router) and, once the registry caught up
// on the stream, turns replication on. Until then both act alone. The zero
// value is ready to use.
type Router struct {
	// Clock is the directory's clock, which says when the node joined
	// (Joined); default time.Now.
	Clock func() time.Time

	joined      atomic.Pointer[joinedNode]
	replicating atomic.Bool
}

// errNotJoined is the Router's error before its node joined the cluster.
var errNotJoined = errors.New("cluster: this node has not joined its cluster")

// joinedNode is the node a Router reaches and when it joined.
type joinedNode struct {
	node *Node
	at   time.Time
}

// join points r at n, which joined its cluster now.
func (r *Router) join(n *Node) {
	now := time.Now
	if r.Clock != nil {
		now = r.Clock
	}
	r.joined.Store(&joinedNode{node: n, at: now()})
}

// node returns the joined node; nil before Start.
func (r *Router) node() *Node {
	if j := r.joined.Load(); j != nil {
		return j.node
	}
	return nil
}

// Joined reports whether this node joined its cluster, and when.
func (r *Router) Joined() (time.Time, bool) {
	if j := r.joined.Load(); j != nil {
		return j.at, true
	}
	return time.Time{}, false
}

// NodeFor returns the other node holding beamID's session (Node.NodeFor).
func (r *Router) NodeFor(beamID string) (string, bool) {
	if n := r.node(); n != nil {
		return n.NodeFor(beamID)
	}
	return "", false
}

// Hand relays h on node (Node.Hand).
func (r *Router) Hand(ctx context.Context, node string, h directory.HandOver) (directory.HandReply, error) {
	if n := r.node(); n != nil {
		return n.Hand(ctx, node, h)
	}
	return directory.HandReply{}, errNotJoined
}

// ClaimNonce claims from's nonce in the cluster (Node.ClaimNonce).
func (r *Router) ClaimNonce(ctx context.Context, from, nonce string) (bool, error) {
	if n := r.node(); n != nil {
		return n.ClaimNonce(ctx, from, nonce)
	}
	return false, errNotJoined
}

// SessionUp tells the cluster this node holds beamID's session.
func (r *Router) SessionUp(beamID string) {
	if n := r.node(); n != nil {
		n.SessionUp(beamID)
	}
}

// SessionDown tells the cluster this node no longer holds beamID's session.
func (r *Router) SessionDown(beamID string) {
	if n := r.node(); n != nil {
		n.SessionDown(beamID)
	}
}

// RecordDelivery stores a delivery record (Node.RecordDelivery).
func (r *Router) RecordDelivery(ctx context.Context, rec directory.DeliveryRecord) error {
	if n := r.node(); n != nil {
		return n.RecordDelivery(ctx, rec)
	}
	return errNotJoined
}

// Delivery reads the delivery record of from's nonce (Node.Delivery).
func (r *Router) Delivery(ctx context.Context, from, nonce string) (directory.DeliveryRecord, bool, error) {
	if n := r.node(); n != nil {
		return n.Delivery(ctx, from, nonce)
	}
	return directory.DeliveryRecord{}, false, errNotJoined
}

// Replicating reports whether the registry's mutations go through the
// cluster's stream (registry.Replicator).
func (r *Router) Replicating() bool { return r.replicating.Load() && r.node() != nil }

// Publish appends a registry operation to the cluster's stream
// (Node.Publish).
func (r *Router) Publish(ctx context.Context, after uint64, op []byte) (uint64, error) {
	if n := r.node(); n != nil {
		return n.Publish(ctx, after, op)
	}
	return 0, errNotJoined
}

// Settle waits for the other serving nodes to apply the stream up to seq
// (Node.Settle).
func (r *Router) Settle(ctx context.Context, seq uint64) {
	if n := r.node(); n != nil {
		n.Settle(ctx, seq)
	}
}
