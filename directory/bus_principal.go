package directory

import "context"

// BusPrincipal is who a bus request acts as. In cluster mode a node that
// authenticated a client and forwards its request to another node
// (federation/cluster) sends the principal, not the client's credentials;
// the receiving node proves the forwarding node's membership and hands
// the principal to the bus in the request's context.
type BusPrincipal struct {
	// Agent is the Beam ID of an agent's API key; "" for a trusted caller.
	Agent string `json:"agent,omitempty"`
	// Trusted is the operator token or the bus key.
	Trusted bool `json:"trusted,omitempty"`
	// Via says how the client authenticated: "operator", BusAuthBusKey or
	// BusAuthAPIKey.
	Via string `json:"via"`
}

// Valid reports whether p is one the bus could have authenticated.
func (p BusPrincipal) Valid() bool {
	switch {
	case p.Trusted:
		return p.Agent == "" && (p.Via == "operator" || p.Via == BusAuthBusKey)
	default:
		return p.Agent != "" && len(p.Agent) <= 256 && p.Via == BusAuthAPIKey
	}
}

type busPrincipalKey struct{}

// WithBusPrincipal returns ctx carrying p, the principal a member of the
// cluster authenticated; only the cluster's request handler sets it.
func WithBusPrincipal(ctx context.Context, p BusPrincipal) context.Context {
	return context.WithValue(ctx, busPrincipalKey{}, p)
}

// BusPrincipalFrom returns the principal WithBusPrincipal put in ctx.
func BusPrincipalFrom(ctx context.Context) (BusPrincipal, bool) {
	p, ok := ctx.Value(busPrincipalKey{}).(BusPrincipal)
	return p, ok
}
