package federation

import (
	"encoding/base64"
	"sort"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// natsAuth admits the clients of the embedded NATS server
// (server.Options.CustomClientAuthentication): an nkey that signed the
// server's nonce and belongs to this directory (unrestricted) or to a
// pinned peer (peerPermissions). Peers change by swapping its table, so
// the server's options are never reloaded at run time; the clients a
// change no longer admits are disconnected.
type natsAuth struct {
	self string // this directory's domain

	mu      sync.Mutex
	ns      *server.Server                 // set before the server starts
	domains map[string]string              // admitted nkey → domain
	clients map[string]map[uint64]struct{} // nkey → IDs of the clients it admitted
}

func newNATSAuth(self string) *natsAuth {
	return &natsAuth{self: self, domains: map[string]string{}, clients: map[string]map[uint64]struct{}{}}
}

// Check implements server.Authentication. nats-server asks it only for
// CLIENT connections; routes authenticate with the cluster credentials
// (federation/cluster) and internal clients are not asked.
func (a *natsAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	opts := c.GetOpts()
	nonce := c.GetNonce()
	if opts.Nkey == "" || opts.Sig == "" || len(nonce) == 0 {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(opts.Sig)
	if err != nil {
		if sig, err = base64.StdEncoding.DecodeString(opts.Sig); err != nil {
			return false
		}
	}
	pub, err := nkeys.FromPublicKey(opts.Nkey)
	if err != nil || pub.Verify(nonce, sig) != nil {
		return false
	}
	id := c.GetID()
	a.mu.Lock()
	domain, ok := a.domains[opts.Nkey]
	if ok {
		a.trackLocked(opts.Nkey, id)
	}
	a.mu.Unlock()
	if !ok {
		return false
	}
	// Noted before registering: a change from now on disconnects it. The
	// client joins the global account, as nkey users of the options did.
	user := &server.User{Username: opts.Nkey}
	if domain != a.self {
		user.Permissions = peerPermissions(a.self, domain)
	}
	c.RegisterUser(user)
	return true
}

// trackLocked notes client id of nkey, forgetting the clients of nkey
// that are gone.
func (a *natsAuth) trackLocked(nkey string, id uint64) {
	ids := a.clients[nkey]
	if ids == nil {
		ids = map[uint64]struct{}{}
		a.clients[nkey] = ids
	}
	if a.ns != nil {
		for old := range ids {
			if a.ns.GetClient(old) == nil {
				delete(ids, old)
			}
		}
	}
	ids[id] = struct{}{}
}

// set replaces the admitted keys (nkey → domain) and returns the IDs of
// the clients admitted under a key that is gone or now names another
// domain; the caller disconnects them.
func (a *natsAuth) set(domains map[string]string) []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var cut []uint64
	for nkey, d := range a.domains {
		if nd, ok := domains[nkey]; ok && nd == d {
			continue
		}
		for id := range a.clients[nkey] {
			cut = append(cut, id)
		}
		delete(a.clients, nkey)
	}
	a.domains = domains
	sort.Slice(cut, func(i, j int) bool { return cut[i] < cut[j] })
	return cut
}

// admittedLocked is the key table of this directory and its pinned peers;
// this directory's key wins over a peer pinned with the same key.
func (n *Node) admittedLocked() map[string]string {
	out := make(map[string]string, len(n.peers)+1)
	for d, ps := range n.peers {
		if u, err := NkeyUser(ps.PublicKey); err == nil {
			out[u] = d
		}
	}
	if self, err := n.nkey.PublicKey(); err == nil {
		out[self] = n.cfg.Domain
	}
	return out
}

// syncAuthLocked applies the pinned peers to the embedded server's
// admission and returns the clients to disconnect (disconnectClients,
// after n.mu is released).
func (n *Node) syncAuthLocked() []uint64 {
	if n.auth == nil {
		return nil
	}
	return n.auth.set(n.admittedLocked())
}

// disconnectClients closes the embedded server's clients ids.
func (n *Node) disconnectClients(ids []uint64) {
	for _, id := range ids {
		if err := n.ns.DisconnectClientByID(id); err == nil {
			n.lg.Info("disconnected a client no longer admitted", "client", id)
		}
	}
}
