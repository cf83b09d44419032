package registry

import (
	"context"
	"net/http"
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

// SetRemoteLookup installs how GET /agents/{beamId} answers for an agent
// of a pinned peer's domain (federation resolves its key from the peer),
// so that a sender verifies a peer agent's beam/2 result JWS like a local
// agent's. fn returns false when the peer does not know the agent.
func (r *Registry) SetRemoteLookup(fn func(ctx context.Context, beamID string) (RemoteKey, bool)) {
	r.mu.Lock()
	r.remoteLookup = fn
	r.mu.Unlock()
}

// lookupRemote answers a lookup of an agent this registry does not hold
// from the peer that serves its domain; false when none does.
func (r *Registry) lookupRemote(w http.ResponseWriter, req *http.Request, beamID string) bool {
	r.mu.RLock()
	fn := r.remoteLookup
	r.mu.RUnlock()
	if fn == nil || r.Serves(beamID) {
		return false
	}
	k, ok := fn(req.Context(), beamID)
	if !ok {
		return false
	}
	writeJSON(w, http.StatusOK, k)
	return true
}
