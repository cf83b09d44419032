package registry

import (
	"context"
	"net/http"

	"github.com/beamdir/beam/internal/httpjson"
)

// RemoteKey is a peer directory's agent as its home directory resolved it.
type RemoteKey struct {
	// BeamID is the agent.
	BeamID string `json:"beamId"`
	// PublicKey is its current key (base64 SPKI DER, as registered there).
	PublicKey string `json:"publicKey"`
	// Directory is the domain of the peer directory that serves it.
	Directory string `json:"directory"`
	// Remote is always true: the agent is not registered here.
	Remote bool `json:"remote"`
}

// Peers answers for the agents of pinned peer directories (federation's
// Router implements it; Config.Peers).
type Peers interface {
	// IsPeerDomain reports whether a pinned peer serves domain: nobody may
	// register a Beam ID in it here, so nothing shadows the peer's agents.
	IsPeerDomain(domain string) bool
	// LookupRemote resolves an agent of a pinned peer's domain (its key
	// from the peer) for GET /agents/{beamId}, so that a sender verifies a
	// peer agent's beam/2 result JWS like a local agent's; false when the
	// peer does not know the agent.
	LookupRemote(ctx context.Context, beamID string) (RemoteKey, bool)
}

// lookupRemote answers a lookup of an agent this registry does not hold
// from the peer that serves its domain; false when none does.
func (r *Registry) lookupRemote(w http.ResponseWriter, req *http.Request, beamID string) bool {
	if r.cfg.Peers == nil || r.Serves(beamID) {
		return false
	}
	k, ok := r.cfg.Peers.LookupRemote(req.Context(), beamID)
	if !ok {
		return false
	}
	httpjson.Write(w, http.StatusOK, k)
	return true
}
