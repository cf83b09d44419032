package registry

import (
	"net/http"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/agents/wire"
)

// parseKeyField reads a required Ed25519 key field.
func parseKeyField(f fields, names ...string) (raw, normalized string, err error) {
	s, ok, err := f.str("INVALID_PUBLIC_KEY", names...)
	if err != nil {
		return "", "", err
	}
	if !ok || s == "" || len(s) > 512 {
		return "", "", errf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "%s is required (base64 SPKI Ed25519)", names[0])
	}
	pub, perr := wire.ParsePublicKey(s)
	if perr != nil {
		return "", "", errf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "%s must be a base64 SPKI Ed25519 key", names[0])
	}
	return s, wire.EncodePublicKey(pub), nil
}

// handleRotate serves POST /agents/{beamId}/keys/rotate.
func (r *Registry) handleRotate(w http.ResponseWriter, req *http.Request) {
	f, err := readObject(w, req)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	raw, newKey, err := parseKeyField(f, "newPublicKey", "new_public_key")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	p, err := f.signed()
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	now := r.now()
	az, err := r.authorize(req, &a, p, map[string]any{
		"action": "keys.rotate", "beamId": a.BeamID, "newPublicKey": raw,
	}, false, now)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	if newKey == a.PublicKeyB64 {
		r.writeErr(w, req, errf(http.StatusBadRequest, "NOOP_ROTATION", "newPublicKey is already the current key"))
		return
	}
	pub, _ := wire.ParsePublicKey(newKey) // validated above
	next := a
	previous := a.PublicKeyB64
	if err := rotateInto(&next, newKey, pub, now); err != nil {
		r.writeErr(w, req, err)
		return
	}
	next.UpdatedAt = now
	err = r.commit(req.Context(), az, now, "keys.rotate", a.BeamID,
		map[string]any{"previousKey": previous, "newKey": newKey}, func(tx *sqlx.Tx) error {
			if err := putAgent(req.Context(), tx, &next, now); err != nil {
				return err
			}
			return putKeys(req.Context(), tx, &next)
		})
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.setAgent(next.BeamID, &next)
	writeJSON(w, http.StatusOK, map[string]any{
		"beamId": next.BeamID, "rotated": true, "previousKey": previous,
		"agent": fullViewOf(&next, now), "keyState": keyStateOf(&next),
	})
}

// handleRevoke serves POST /agents/{beamId}/keys/revoke.
func (r *Registry) handleRevoke(w http.ResponseWriter, req *http.Request) {
	f, err := readObject(w, req)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	raw, key, err := parseKeyField(f, "publicKey", "public_key")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	p, err := f.signed()
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	now := r.now()
	az, err := r.authorize(req, &a, p, map[string]any{
		"action": "keys.revoke", "beamId": a.BeamID, "publicKey": raw,
	}, false, now)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	if key == a.PublicKeyB64 {
		r.writeErr(w, req, errf(http.StatusConflict, "ACTIVE_KEY_REQUIRED", "the active key cannot be revoked; rotate first"))
		return
	}
	idx := -1
	for i, k := range a.Keys {
		if k.PublicKey == key {
			idx = i
		}
	}
	if idx < 0 {
		r.writeErr(w, req, errf(http.StatusNotFound, "KEY_NOT_FOUND", "the agent never used this key"))
		return
	}
	next := a
	next.Keys = append([]Key(nil), a.Keys...)
	already := next.Keys[idx].Revoked()
	if !already {
		next.Keys[idx].RevokedAt = now
		next.UpdatedAt = now
	}
	err = r.commit(req.Context(), az, now, "keys.revoke", a.BeamID,
		map[string]any{"key": key, "alreadyRevoked": already}, func(tx *sqlx.Tx) error {
			if already {
				return nil
			}
			if err := putAgent(req.Context(), tx, &next, now); err != nil {
				return err
			}
			return putKeys(req.Context(), tx, &next)
		})
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.setAgent(next.BeamID, &next)
	writeJSON(w, http.StatusOK, map[string]any{
		"beamId": next.BeamID, "revoked": true, "revokedKey": key,
		"agent": fullViewOf(&next, now), "keyState": keyStateOf(&next),
	})
}

// handleVisibility serves PATCH /agents/{beamId}/visibility.
func (r *Registry) handleVisibility(w http.ResponseWriter, req *http.Request) {
	f, err := readObject(w, req)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	vis, ok, err := f.str("INVALID_VISIBILITY", "visibility")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	if !ok {
		r.writeErr(w, req, errf(http.StatusBadRequest, "INVALID_VISIBILITY", "visibility is required"))
		return
	}
	if err := validateVisibility(vis); err != nil {
		r.writeErr(w, req, err)
		return
	}
	p, err := f.signed()
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	now := r.now()
	az, err := r.authorize(req, &a, p, map[string]any{
		"action": "agents.visibility", "beamId": a.BeamID, "visibility": vis,
	}, true, now)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	next := a
	next.Visibility = vis
	next.UpdatedAt = now
	err = r.commit(req.Context(), az, now, "agent.visibility", a.BeamID,
		map[string]any{"from": a.Visibility, "to": vis}, func(tx *sqlx.Tx) error {
			return putAgent(req.Context(), tx, &next, now)
		})
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.setAgent(next.BeamID, &next)
	writeJSON(w, http.StatusOK, fullViewOf(&next, now))
}

// handleConfig serves PATCH /agents/{beamId}/config: httpEndpoint and/or
// dhPublicKey ("" clears a value).
func (r *Registry) handleConfig(w http.ResponseWriter, req *http.Request) {
	f, err := readObject(w, req)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	endpoint, err := f.optStr("INVALID_HTTP_ENDPOINT", "httpEndpoint", "http_endpoint")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	dh, err := f.optStr("INVALID_DH_PUBLIC_KEY", "dhPublicKey", "dh_public_key")
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	if endpoint == nil && dh == nil {
		r.writeErr(w, req, errf(http.StatusBadRequest, "INVALID_BODY", "send httpEndpoint and/or dhPublicKey"))
		return
	}
	if endpoint != nil {
		if err := validateEndpoint(*endpoint, r.cfg.AllowInsecureEndpoints); err != nil {
			r.writeErr(w, req, err)
			return
		}
	}
	if dh != nil {
		if err := validateDHKey(*dh); err != nil {
			r.writeErr(w, req, err)
			return
		}
	}
	p, err := f.signed()
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	obj := map[string]any{"action": "agents.config", "beamId": a.BeamID, "httpEndpoint": nil, "dhPublicKey": nil}
	next := a
	if endpoint != nil {
		obj["httpEndpoint"] = *endpoint
		next.HTTPEndpoint = *endpoint
	}
	if dh != nil {
		obj["dhPublicKey"] = *dh
		next.DHPublicKey = *dh
	}
	now := r.now()
	az, err := r.authorize(req, &a, p, obj, true, now)
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	next.UpdatedAt = now
	err = r.commit(req.Context(), az, now, "agent.config", a.BeamID,
		map[string]any{"httpEndpoint": next.HTTPEndpoint, "dhPublicKeyChanged": dh != nil}, func(tx *sqlx.Tx) error {
			return putAgent(req.Context(), tx, &next, now)
		})
	if err != nil {
		r.writeErr(w, req, err)
		return
	}
	r.setAgent(next.BeamID, &next)
	writeJSON(w, http.StatusOK, fullViewOf(&next, now))
}
