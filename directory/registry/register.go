package registry

import (
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// registerRequest is a decoded, validated POST /agents/register body.
type registerRequest struct {
	beamID       string // lowercase; "" when the server must generate one
	org          string // requested org ("" when absent)
	displayName  string
	capabilities []string
	capsGiven    bool
	publicKey    string // normalized base64 SPKI
	publicKeyRaw string // as sent, for signature checks
	pub          ed25519.PublicKey
	email        *string
	description  *string
	logoURL      *string
	website      *string
	visibility   *string
	httpEndpoint *string
	dhPublicKey  *string
	proof        proof
}

// decodeRegister parses and validates a registration body. It never
// panics; every failure is an *httpjson.Error.
func decodeRegister(body []byte, allowInsecure bool) (*registerRequest, error) {
	f, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	req := &registerRequest{}

	name, ok, err := f.str("INVALID_DISPLAY_NAME", "displayName", "display_name")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_DISPLAY_NAME", "displayName is required")
	}
	if req.displayName, err = validateDisplayName(name); err != nil {
		return nil, err
	}
	if req.capabilities, req.capsGiven, err = decodeCapabilities(f); err != nil {
		return nil, err
	}
	pk, ok, err := f.str("INVALID_PUBLIC_KEY", "publicKey", "public_key")
	if err != nil {
		return nil, err
	}
	if !ok || pk == "" {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "publicKey is required")
	}
	if len(pk) > 512 {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "publicKey is too long")
	}
	pub, perr := wire.ParsePublicKey(pk)
	if perr != nil {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_PUBLIC_KEY", "publicKey must be a base64 SPKI Ed25519 key")
	}
	req.pub = pub
	req.publicKeyRaw = pk
	req.publicKey = wire.EncodePublicKey(pub)

	beamID, ok, err := f.str("INVALID_BEAM_ID", "beamId", "beam_id")
	if err != nil {
		return nil, err
	}
	org, orgGiven, err := f.str("INVALID_ORG", "org")
	if err != nil {
		return nil, err
	}
	org = strings.ToLower(strings.TrimSpace(org))
	if orgGiven && org != "" && org != "personal" && !isOrgLabel(org) {
		return nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_ORG", "org must be a lowercase label")
	}
	req.org = org
	if ok && strings.TrimSpace(beamID) != "" {
		id, err := parseBeamID(beamID)
		if err != nil {
			return nil, err
		}
		if org != "" {
			if id.Personal() && org != "personal" || !id.Personal() && org != id.Org {
				return nil, httpjson.Errorf(http.StatusBadRequest, "ORG_MISMATCH", "org %q does not match Beam ID %s", org, id.String())
			}
		}
		req.beamID = id.String()
	}

	email := func(s string) error {
		if s == "" {
			return nil
		}
		return validateEmail(s)
	}
	if req.email, err = f.checkedStr("INVALID_EMAIL", email, "email"); err != nil {
		return nil, err
	}
	if req.description, err = f.checkedStr("INVALID_DESCRIPTION", validateDescription, "description"); err != nil {
		return nil, err
	}
	if req.logoURL, err = f.checkedStr("INVALID_LOGO_URL", func(s string) error {
		return validateWebURL(s, "INVALID_LOGO_URL", "logoUrl")
	}, "logoUrl", "logo_url"); err != nil {
		return nil, err
	}
	if req.website, err = f.checkedStr("INVALID_WEBSITE", func(s string) error {
		return validateWebURL(s, "INVALID_WEBSITE", "website")
	}, "website"); err != nil {
		return nil, err
	}
	if req.visibility, err = f.checkedStr("INVALID_VISIBILITY", validateVisibility, "visibility"); err != nil {
		return nil, err
	}
	if req.httpEndpoint, err = f.checkedStr("INVALID_HTTP_ENDPOINT", func(s string) error {
		return validateEndpoint(s, allowInsecure)
	}, "httpEndpoint", "http_endpoint"); err != nil {
		return nil, err
	}
	if req.dhPublicKey, err = f.checkedStr("INVALID_DH_PUBLIC_KEY", validateDHKey, "dhPublicKey", "dh_public_key"); err != nil {
		return nil, err
	}
	if req.proof, err = f.signed(); err != nil {
		return nil, err
	}
	return req, nil
}

// handleRegister serves POST /agents/register.
func (r *Registry) handleRegister(w http.ResponseWriter, req *http.Request) error {
	body, err := readBody(w, req)
	if err != nil {
		return err
	}
	rr, err := decodeRegister(body, r.cfg.AllowInsecureEndpoints)
	if err != nil {
		return err
	}
	status, view, err := r.register(req.Context(), req, rr)
	if err != nil {
		return err
	}
	httpjson.Write(w, status, view)
	return nil
}

// echoSecretOK reports whether req carries the configured echo secret.
func (r *Registry) echoSecretOK(req *http.Request) bool {
	if r.cfg.EchoSecret == "" {
		return false
	}
	tok, ok := bearer(req)
	return ok && subtle.ConstantTimeCompare([]byte(tok), []byte(r.cfg.EchoSecret)) == 1
}

func (r *Registry) register(ctx context.Context, req *http.Request, rr *registerRequest) (int, any, error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	now := r.now()

	echoProof := false
	if rr.beamID == EchoBeamID {
		if r.cfg.EchoSecret == "" {
			return 0, nil, httpjson.Errorf(http.StatusConflict, "RESERVED_BEAM_ID", "%s is reserved", EchoBeamID)
		}
		if !r.echoSecretOK(req) {
			return 0, nil, httpjson.Errorf(http.StatusUnauthorized, "ECHO_AGENT_SECRET_REQUIRED", "%s needs the echo agent secret", EchoBeamID)
		}
		echoProof = true
	}
	if rr.beamID == "" {
		id, err := r.generateBeamID(rr)
		if err != nil {
			return 0, nil, err
		}
		rr.beamID = id
	}
	existing, exists := r.Get(rr.beamID)
	if !exists {
		return r.registerNew(ctx, rr, now)
	}

	// Re-registration: find the proof of ownership.
	kind := ""
	actor := "agent:" + rr.beamID
	switch {
	case echoProof:
		kind, actor = "echo", "echo-secret"
	default:
		if key, ok := apiKeyFrom(req); ok {
			a, ok := r.AuthenticateAPIKey(key)
			if !ok {
				return 0, nil, httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "invalid API key")
			}
			if a.BeamID != rr.beamID {
				return 0, nil, httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "API key belongs to another agent")
			}
			kind = "apikey"
		} else if rr.proof.signature != "" {
			if err := r.verifySigned(&existing, map[string]any{
				"action": "agents.register", "beamId": rr.beamID, "publicKey": rr.publicKeyRaw,
			}, rr.proof, now); err != nil {
				return 0, nil, err
			}
			kind = "signature"
		}
	}
	if kind == "" {
		if existing.PublicKeyB64 == rr.publicKey {
			// SDK 0.5.1 re-registers at every start: an idempotent no-op.
			return http.StatusOK, publicViewOf(&existing, now), nil
		}
		return 0, nil, httpjson.Errorf(http.StatusConflict, "BEAM_ID_TAKEN",
			"%s is registered with another key; re-registering an existing Beam ID needs proof (its API key, or a signature by its current key)", rr.beamID)
	}

	next := existing
	next.Keys = append([]Key(nil), existing.Keys...)
	next.DisplayName = rr.displayName
	if rr.capsGiven {
		next.Capabilities = rr.capabilities
	}
	applyProfile(&next, rr)
	next.UpdatedAt = now
	next.LastSeen = now
	details := map[string]any{"proof": kind}
	if rr.publicKey != existing.PublicKeyB64 {
		if err := rotateInto(&next, rr.publicKey, rr.pub, now); err != nil {
			return 0, nil, err
		}
		details["previousKey"] = existing.PublicKeyB64
		details["newKey"] = rr.publicKey
	}
	apiKey := ""
	if kind != "apikey" {
		k, hash, err := newAPIKey(next.BeamID)
		if err != nil {
			return 0, nil, err
		}
		apiKey, next.apiKeyHash = k, hash
	}
	az := authorization{actor: actor}
	if kind == "signature" {
		az.nonce = rr.proof.nonce
	}
	err := r.commit(ctx, az, now, &op{Kind: opReregister, Target: next.BeamID, Details: details,
		Agent: stateOf(&next, now), Keys: true})
	if err != nil {
		return 0, nil, err
	}
	r.setAgent(next.BeamID, &next)
	return http.StatusOK, registerView{fullView: fullViewOf(&next, now), APIKey: apiKey}, nil
}

func (r *Registry) registerNew(ctx context.Context, rr *registerRequest, now time.Time) (int, any, error) {
	id, err := wire.ParseBeamID(rr.beamID)
	if err != nil {
		return 0, nil, httpjson.Errorf(http.StatusBadRequest, "INVALID_BEAM_ID", "invalid Beam ID")
	}
	if err := r.checkClaim(rr.beamID); err != nil {
		return 0, nil, err
	}
	a := &Agent{
		BeamID: rr.beamID, Org: "personal", Personal: id.Personal(), DisplayName: rr.displayName,
		Capabilities: rr.capabilities, PublicKey: rr.pub, PublicKeyB64: rr.publicKey,
		VerificationTier: "basic", Visibility: r.cfg.DefaultVisibility,
		CreatedAt: now, UpdatedAt: now, LastSeen: now,
		Keys: []Key{{PublicKey: rr.publicKey, CreatedAt: now}},
	}
	if !id.Personal() {
		a.Org = id.Org
	}
	if a.Capabilities == nil {
		a.Capabilities = []string{}
	}
	applyProfile(a, rr)
	apiKey, hash, err := newAPIKey(a.BeamID)
	if err != nil {
		return 0, nil, err
	}
	a.apiKeyHash = hash
	actor := "anonymous"
	if a.BeamID == EchoBeamID {
		actor = "echo-secret"
	}
	member := r.membershipOf(a)
	err = r.do(ctx, &op{Kind: opRegister, At: micros(now), Actor: actor, Target: a.BeamID,
		Details: map[string]any{"publicKey": a.PublicKeyB64}, Agent: stateOf(a, now), Member: member})
	if err != nil {
		return 0, nil, err
	}
	r.setAgent(a.BeamID, a)
	if member != "" {
		r.setMember(a.Org, a.BeamID, member)
	}
	r.lg.Info("agent registered", "beamId", a.BeamID, "orgMembership", member)
	return http.StatusCreated, registerView{fullView: fullViewOf(a, now), APIKey: apiKey, OrgMembership: member}, nil
}

// applyProfile copies the optional profile fields present in rr onto a.
func applyProfile(a *Agent, rr *registerRequest) {
	set := func(dst *string, src *string) {
		if src != nil {
			*dst = *src
		}
	}
	set(&a.Email, rr.email)
	set(&a.Description, rr.description)
	set(&a.LogoURL, rr.logoURL)
	set(&a.Website, rr.website)
	set(&a.Visibility, rr.visibility)
	set(&a.HTTPEndpoint, rr.httpEndpoint)
	set(&a.DHPublicKey, rr.dhPublicKey)
	if rr.email != nil {
		a.EmailVerified = false
	}
}

// rotateInto makes newKey the current key of a and revokes the old one.
// A key the agent used before cannot come back.
func rotateInto(a *Agent, newKey string, pub ed25519.PublicKey, now time.Time) error {
	for _, k := range a.Keys {
		if k.PublicKey == newKey {
			return httpjson.Errorf(http.StatusConflict, "KEY_ALREADY_REVOKED", "this key was used by the agent before and is revoked")
		}
	}
	keys := make([]Key, len(a.Keys), len(a.Keys)+1)
	copy(keys, a.Keys)
	for i := range keys {
		if !keys[i].Revoked() {
			keys[i].RevokedAt = now
		}
	}
	a.Keys = append(keys, Key{PublicKey: newKey, CreatedAt: now})
	a.PublicKey = pub
	a.PublicKeyB64 = newKey
	return nil
}

// generateBeamID derives a free Beam ID from the display name (or the
// email's local part), adding -2, -3… on collision.
func (r *Registry) generateBeamID(rr *registerRequest) (string, error) {
	base := slugify(rr.displayName)
	if base == "agent" && rr.email != nil && *rr.email != "" {
		local, _, _ := strings.Cut(*rr.email, "@")
		base = slugify(local)
	}
	// Without an org the ID lands in the directory's own domain.
	suffix := "@" + r.cfg.Domain
	if rr.org != "" && rr.org != "personal" {
		suffix = "@" + rr.org + ".beam.directory"
	}
	for i := 1; i <= 1000; i++ {
		cand := base + suffix
		if i > 1 {
			cand = fmt.Sprintf("%s-%d%s", base, i, suffix)
		}
		if cand == EchoBeamID {
			continue
		}
		if _, err := wire.ParseBeamID(cand); err != nil {
			return "", httpjson.Errorf(http.StatusBadRequest, "INVALID_BEAM_ID", "cannot derive a Beam ID from displayName; send beamId")
		}
		r.mu.RLock()
		retired := r.tombstones[cand]
		r.mu.RUnlock()
		if _, taken := r.Get(cand); !taken && !retired {
			return cand, nil
		}
	}
	return "", httpjson.Errorf(http.StatusConflict, "BEAM_ID_TAKEN", "no free Beam ID derived from %q; send beamId", base)
}

// marshalCanonical is the JSON of a signed object; wire.VerifyCanonical
// canonicalizes it.
func marshalCanonical(obj map[string]any) ([]byte, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("marshal signed object: %w", err)
	}
	return b, nil
}
