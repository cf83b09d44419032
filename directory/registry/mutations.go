package registry

import (
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// parseKeyField reads a required Ed25519 key field.
func parseKeyField(f fields, names ...string) (raw, normalized string, err error) {
	s, ok, err := f.str("INVALID_PUBLIC_KEY", names...)
	if err != nil {
		return "", "", err
	}
	if !ok || s == "" || len(s) > 512 {
		return "", "", httpjson.Errorf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "%s is required (base64 SPKI Ed25519)", names[0])
	}
	pub, perr := wire.ParsePublicKey(s)
	if perr != nil {
		return "", "", httpjson.Errorf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "%s must be a base64 SPKI Ed25519 key", names[0])
	}
	return s, wire.EncodePublicKey(pub), nil
}

// parseKeyAction is the agentRoute.parse of the key routes: it reads the
// key field names into *key (normalized) and signs action over the Beam ID
// and the key as sent, under names[0].
func parseKeyAction(action string, key *string, names ...string) func(fields, *Agent) (map[string]any, error) {
	return func(f fields, a *Agent) (map[string]any, error) {
		raw, normalized, err := parseKeyField(f, names...)
		if err != nil {
			return nil, err
		}
		*key = normalized
		return map[string]any{"action": action, "beamId": a.BeamID, names[0]: raw}, nil
	}
}

// handleRotate serves POST /agents/{beamId}/keys/rotate.
func (r *Registry) handleRotate(w http.ResponseWriter, req *http.Request) error {
	var newKey string
	return r.changeAgent(w, req, agentRoute{
		parse: parseKeyAction("keys.rotate", &newKey, "newPublicKey", "new_public_key"),
		apply: func(next *Agent, now time.Time) (agentChange, error) {
			previous := next.PublicKeyB64
			if newKey == previous {
				return agentChange{}, httpjson.Errorf(http.StatusBadRequest, "NOOP_ROTATION", "newPublicKey is already the current key")
			}
			pub, _ := wire.ParsePublicKey(newKey) // validated by parseKeyField
			if err := rotateInto(next, newKey, pub, now); err != nil {
				return agentChange{}, err
			}
			next.UpdatedAt = now
			return agentChange{
				action: "keys.rotate", keys: true,
				details: map[string]any{"previousKey": previous, "newKey": newKey},
				reply:   map[string]any{"rotated": true, "previousKey": previous},
			}, nil
		},
	})
}

// handleRevoke serves POST /agents/{beamId}/keys/revoke.
func (r *Registry) handleRevoke(w http.ResponseWriter, req *http.Request) error {
	var key string
	return r.changeAgent(w, req, agentRoute{
		parse: parseKeyAction("keys.revoke", &key, "publicKey", "public_key"),
		apply: func(next *Agent, now time.Time) (agentChange, error) {
			if key == next.PublicKeyB64 {
				return agentChange{}, httpjson.Errorf(http.StatusConflict, "ACTIVE_KEY_REQUIRED", "the active key cannot be revoked; rotate first")
			}
			idx := -1
			for i, k := range next.Keys {
				if k.PublicKey == key {
					idx = i
				}
			}
			if idx < 0 {
				return agentChange{}, httpjson.Errorf(http.StatusNotFound, "KEY_NOT_FOUND", "the agent never used this key")
			}
			next.Keys = append([]Key(nil), next.Keys...)
			already := next.Keys[idx].Revoked()
			if !already {
				next.Keys[idx].RevokedAt = now
				next.UpdatedAt = now
			}
			return agentChange{
				action: "keys.revoke", keys: true, noWrite: already,
				details: map[string]any{"key": key, "alreadyRevoked": already},
				reply:   map[string]any{"revoked": true, "revokedKey": key},
			}, nil
		},
	})
}

// handleVisibility serves PATCH /agents/{beamId}/visibility.
func (r *Registry) handleVisibility(w http.ResponseWriter, req *http.Request) error {
	var vis string
	return r.changeAgent(w, req, agentRoute{
		allowOperator: true,
		parse: func(f fields, a *Agent) (map[string]any, error) {
			v, ok, err := f.str("INVALID_VISIBILITY", "visibility")
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_VISIBILITY", "visibility is required")
			}
			if err := validateVisibility(v); err != nil {
				return nil, err
			}
			vis = v
			return map[string]any{"action": "agents.visibility", "beamId": a.BeamID, "visibility": vis}, nil
		},
		apply: func(next *Agent, now time.Time) (agentChange, error) {
			from := next.Visibility
			next.Visibility = vis
			next.UpdatedAt = now
			return agentChange{action: "agent.visibility", details: map[string]any{"from": from, "to": vis}}, nil
		},
	})
}

// handleConfig serves PATCH /agents/{beamId}/config: httpEndpoint and/or
// dhPublicKey ("" clears a value) and/or requireSenderSignatures and
// acceptAttestedPipelineHops.
func (r *Registry) handleConfig(w http.ResponseWriter, req *http.Request) error {
	var endpoint, dh *string
	var requireSigs, pipelineHops *bool
	return r.changeAgent(w, req, agentRoute{
		allowOperator: true,
		parse: func(f fields, a *Agent) (map[string]any, error) {
			var err error
			if endpoint, err = f.optStr("INVALID_HTTP_ENDPOINT", "httpEndpoint", "http_endpoint"); err != nil {
				return nil, err
			}
			if dh, err = f.optStr("INVALID_DH_PUBLIC_KEY", "dhPublicKey", "dh_public_key"); err != nil {
				return nil, err
			}
			if requireSigs, err = f.optBool("INVALID_BODY", "requireSenderSignatures"); err != nil {
				return nil, err
			}
			if pipelineHops, err = f.optBool("INVALID_BODY", "acceptAttestedPipelineHops"); err != nil {
				return nil, err
			}
			if endpoint == nil && dh == nil && requireSigs == nil && pipelineHops == nil {
				return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_BODY",
					"send httpEndpoint, dhPublicKey, requireSenderSignatures and/or acceptAttestedPipelineHops")
			}
			obj := map[string]any{"action": "agents.config", "beamId": a.BeamID, "httpEndpoint": nil, "dhPublicKey": nil}
			if requireSigs != nil {
				// Signed only when sent, so signatures made before the
				// setting existed still verify.
				obj["requireSenderSignatures"] = *requireSigs
			}
			if pipelineHops != nil {
				obj["acceptAttestedPipelineHops"] = *pipelineHops
			}
			if endpoint != nil {
				if err := validateEndpoint(*endpoint, r.cfg.AllowInsecureEndpoints); err != nil {
					return nil, err
				}
				obj["httpEndpoint"] = *endpoint
			}
			if dh != nil {
				if err := validateDHKey(*dh); err != nil {
					return nil, err
				}
				obj["dhPublicKey"] = *dh
			}
			return obj, nil
		},
		apply: func(next *Agent, now time.Time) (agentChange, error) {
			if endpoint != nil {
				next.HTTPEndpoint = *endpoint
			}
			if dh != nil {
				next.DHPublicKey = *dh
			}
			if requireSigs != nil {
				next.RequireSenderSignatures = *requireSigs
			}
			if pipelineHops != nil {
				next.AcceptAttestedPipelineHops = *pipelineHops
			}
			next.UpdatedAt = now
			return agentChange{action: "agent.config",
				details: map[string]any{"httpEndpoint": next.HTTPEndpoint, "dhPublicKeyChanged": dh != nil,
					"requireSenderSignatures":    next.RequireSenderSignatures,
					"acceptAttestedPipelineHops": next.AcceptAttestedPipelineHops}}, nil
		},
	})
}
