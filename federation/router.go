package federation

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// Router reaches the federation node from the parts built before it: the
// registry (registry.Config.Peers) answers for peers' domains and agents,
// the directory (directory.Config.Remote) and the message bus
// (bus.Config.Remote) route to pinned peers through it, and the node, which
// needs them, is built after them. The assembly gives the same
// Router to all three; New points it at the node (Config.Router). Until
// then no recipient is a peer's. The zero value is ready to use.
type Router struct {
	node atomic.Pointer[Node]
}

// errNotStarted is Forward's error before New pointed the router at a node.
var errNotStarted = errors.New("federation: the node is not started")

// PeerFor returns the pinned peer directory serving to.
func (r *Router) PeerFor(to string) (string, bool) {
	n := r.node.Load()
	if n == nil {
		return "", false
	}
	return n.PeerFor(to)
}

// Forward records events and the outbox row that carries the frame to the
// peer (Node.Forward).
func (r *Router) Forward(ctx context.Context, req directory.ForwardRequest, events ...tracing.Event) error {
	n := r.node.Load()
	if n == nil {
		return errNotStarted
	}
	return n.Forward(ctx, req, events...)
}

// LinkDown reports whether the link to peer is down (Node.LinkDown).
func (r *Router) LinkDown(peer string) bool {
	n := r.node.Load()
	return n != nil && n.LinkDown(peer)
}

// LinkKnownDown reports whether the link to peer has been down for a while
// (Node.LinkKnownDown).
func (r *Router) LinkKnownDown(peer string) bool {
	n := r.node.Load()
	return n != nil && n.LinkKnownDown(peer)
}

// IsPeerDomain reports whether a pinned peer serves domain: nobody may
// register an ID in it here.
func (r *Router) IsPeerDomain(domain string) bool {
	n := r.node.Load()
	return n != nil && n.isPeerDomain(domain)
}

// LookupRemote resolves an agent of a pinned peer's domain from the peer.
func (r *Router) LookupRemote(ctx context.Context, beamID string) (registry.RemoteKey, bool) {
	n := r.node.Load()
	if n == nil {
		return registry.RemoteKey{}, false
	}
	return n.lookupRemote(ctx, beamID)
}
