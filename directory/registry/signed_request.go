package registry

import (
	"context"
	"errors"
	"net/http"

	"github.com/beamdir/beam/internal/httpjson"
)

// SignedRequest is a request signed by one of the directory's agents
// outside the registry's own routes (the pipeline gateway, for one): the
// signature covers the canonical JSON of Fields plus beamId, timestamp and
// nonce, as the registry's signed mutations do.
type SignedRequest struct {
	BeamID    string
	Fields    map[string]any
	Timestamp string
	Nonce     string
	Signature string
}

// VerifySignedRequest checks req: the timestamp within ±5 minutes of the
// registry clock, a well-formed nonce, an Ed25519 signature by the agent's
// current key, and a nonce the agent has not used in the last 10 minutes
// (then recorded, in the same scope as the registry's own signed
// mutations). It returns the agent. Errors have an HTTPStatus method: 401
// for an unknown agent, a bad signature or a stale timestamp, 400 for a
// malformed timestamp or nonce, 409 NONCE_REUSED for a replay.
func (r *Registry) VerifySignedRequest(ctx context.Context, req SignedRequest) (Agent, error) {
	a, ok := r.Get(req.BeamID)
	if !ok || req.Signature == "" {
		return Agent{}, httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "signed request: unknown agent or no signature")
	}
	obj := map[string]any{"beamId": a.BeamID}
	for k, v := range req.Fields {
		obj[k] = v
	}
	now := r.now()
	p := proof{timestamp: req.Timestamp, nonce: req.Nonce, signature: req.Signature}
	if err := r.verifySigned(&a, obj, p, now); err != nil {
		return Agent{}, err
	}
	for range maxStaleRetries {
		err := r.do(ctx, &op{Kind: opNonce, At: micros(now), Actor: "agent:" + a.BeamID, Target: a.BeamID, Nonce: req.Nonce})
		var se staleError
		if errors.As(err, &se) {
			if err := r.WaitApplied(ctx, se.after+1); err != nil {
				return Agent{}, err
			}
			continue
		}
		if err != nil {
			return Agent{}, err
		}
		return a, nil
	}
	return Agent{}, httpjson.Errorf(http.StatusServiceUnavailable, "CLUSTER_BUSY", "the registry is changing on other nodes; retry")
}
