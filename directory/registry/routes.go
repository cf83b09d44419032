package registry

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// Routes registers the registry's HTTP routes on mux (Go 1.22 patterns).
// GET /agents/stats is not registered here.
func (r *Registry) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /agents/register", r.serve(r.handleRegister))
	mux.HandleFunc("GET /agents/search", r.serve(r.handleSearch))
	mux.HandleFunc("GET /agents/{beamId}", r.serve(r.handleLookup))
	// One pattern serves /agents/did/{did} and /agents/{beamId}/keys:
	// as two patterns they would overlap on /agents/did/keys.
	mux.HandleFunc("GET /agents/{first}/{second}", r.serve(r.handleAgentsSub))
	mux.HandleFunc("GET /did/{did}", r.serve(r.handleDID))
	mux.HandleFunc("DELETE /agents/{beamId}", r.serve(r.handleDelete))
	mux.HandleFunc("POST /agents/{beamId}/heartbeat", r.serve(r.handleHeartbeat))
	mux.HandleFunc("POST /agents/{beamId}/keys/rotate", r.serve(r.handleRotate))
	mux.HandleFunc("POST /agents/{beamId}/keys/revoke", r.serve(r.handleRevoke))
	mux.HandleFunc("PATCH /agents/{beamId}/visibility", r.serve(r.handleVisibility))
	mux.HandleFunc("PATCH /agents/{beamId}/config", r.serve(r.handleConfig))
	mux.HandleFunc("POST /acl", r.serve(r.handleACLCreate))
	mux.HandleFunc("GET /acl/{beamId}", r.serve(r.handleACLList))
	mux.HandleFunc("DELETE /acl/{id}", r.serve(r.handleACLDelete))
	mux.HandleFunc("POST /agents/{beamId}/release", r.serve(r.handleRelease))
	mux.HandleFunc("GET /orgs/{org}/members", r.serve(r.handleOrgMembers))
	mux.HandleFunc("POST /orgs/{org}/members/{beamId}/approve", r.serve(r.handleOrgMemberStatus(true)))
	mux.HandleFunc("POST /orgs/{org}/members/{beamId}/revoke", r.serve(r.handleOrgMemberStatus(false)))
	mux.HandleFunc("PUT /orgs/{org}/owner", r.serve(r.handleOrgOwner))
}

// agentFromPath resolves the {beamId} path value: 400 INVALID_BEAM_ID or
// 404 NOT_FOUND.
func (r *Registry) agentFromPath(req *http.Request, name string) (Agent, error) {
	id, err := parseBeamID(req.PathValue(name))
	if err != nil {
		return Agent{}, err
	}
	return r.lookup(id.String())
}

// handleLookup serves GET /agents/{beamId}.
func (r *Registry) handleLookup(w http.ResponseWriter, req *http.Request) error {
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		if id, perr := parseBeamID(req.PathValue("beamId")); perr == nil && r.lookupRemote(w, req, id.String()) {
			return nil
		}
		return err
	}
	now := r.now()
	if r.seesFullRow(req, a.BeamID) {
		httpjson.Write(w, http.StatusOK, fullViewOf(&a, now))
		return nil
	}
	httpjson.Write(w, http.StatusOK, publicViewOf(&a, now))
	return nil
}

// seesFullRow reports whether req is the agent itself or an operator.
func (r *Registry) seesFullRow(req *http.Request, beamID string) bool {
	c, err := r.identify(req, beamID)
	return err == nil && (c.owner || c.operator != "")
}

// handleSearch serves GET /agents/search.
func (r *Registry) handleSearch(w http.ResponseWriter, req *http.Request) error {
	q := req.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return httpjson.Errorf(http.StatusBadRequest, "INVALID_QUERY", "limit must be a positive integer")
		}
		limit = min(n, 500)
	}
	minTrust := 0.0
	if s := q.Get("minTrustScore"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v != v {
			return httpjson.Errorf(http.StatusBadRequest, "INVALID_QUERY", "minTrustScore must be a number")
		}
		minTrust = v
	}
	org := strings.ToLower(strings.TrimSpace(q.Get("org")))
	org = strings.TrimSuffix(org, ".beam.directory")
	var caps []string
	for _, c := range strings.Split(q.Get("capabilities"), ",") {
		if c = strings.TrimSpace(c); c != "" {
			caps = append(caps, c)
		}
	}
	text := strings.ToLower(strings.TrimSpace(q.Get("q")))
	tier := strings.TrimSpace(q.Get("verificationTier"))
	if len(text) > 256 || len(caps) > 64 {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_QUERY", "query too long")
	}

	now := r.now()
	r.mu.RLock()
	matches := make([]*Agent, 0)
	for _, e := range r.agents {
		snap := e.snapshot()
		a := &snap
		if a.Visibility == visibilityUnlisted {
			continue
		}
		if org != "" && a.Org != org {
			continue
		}
		if tier != "" && a.VerificationTier != tier {
			continue
		}
		if minTrust > 0 && a.TrustScore(now) < minTrust {
			continue
		}
		if !hasAll(a.Capabilities, caps) {
			continue
		}
		if text != "" && !strings.Contains(strings.ToLower(a.BeamID+"\n"+a.DisplayName+"\n"+a.Description), text) {
			continue
		}
		matches = append(matches, a)
	}
	r.mu.RUnlock()
	sort.Slice(matches, func(i, j int) bool { return matches[i].BeamID < matches[j].BeamID })
	total := len(matches)
	if len(matches) > limit {
		matches = matches[:limit]
	}
	views := make([]publicView, 0, len(matches))
	for _, a := range matches {
		views = append(views, publicViewOf(a, now))
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"agents": views, "total": total})
	return nil
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// handleAgentsSub serves GET /agents/did/{did} and GET /agents/{beamId}/keys.
func (r *Registry) handleAgentsSub(w http.ResponseWriter, req *http.Request) error {
	first, second := req.PathValue("first"), req.PathValue("second")
	switch {
	case first == "did":
		return r.serveDID(w, req, second)
	case second == "keys":
		a, err := r.agentFromPath(req, "first")
		if err != nil {
			return err
		}
		httpjson.Write(w, http.StatusOK, map[string]any{"beamId": a.BeamID, "keyState": keyStateOf(&a)})
		return nil
	default:
		return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "no such route")
	}
}

// handleDID serves GET /did/{did}.
func (r *Registry) handleDID(w http.ResponseWriter, req *http.Request) error {
	return r.serveDID(w, req, req.PathValue("did"))
}

func (r *Registry) serveDID(w http.ResponseWriter, req *http.Request, did string) error {
	a, ok := r.resolveDID(did)
	if !ok {
		return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "DID not found")
	}
	w.Header().Set("Cache-Control", "max-age=60")
	b, err := json.Marshal(didDocumentOf(&a))
	if err != nil {
		return fmt.Errorf("marshal DID document: %w", err)
	}
	w.Header().Set("Content-Type", "application/did+json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

// resolveDID finds the agent named by a did:beam DID (name form or key
// form, including did:key of any of its keys).
func (r *Registry) resolveDID(did string) (Agent, bool) {
	if did == "" || len(did) > 256 {
		return Agent{}, false
	}
	if id, err := wire.ParseDID(did); err == nil {
		return r.Get(id.String())
	}
	// Key-based DIDs: scan the key histories. DID resolution is not a hot
	// path, and the scan is bounded by the registry size.
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.agents {
		for _, k := range e.agent.Keys {
			pub, err := wire.ParsePublicKey(k.PublicKey)
			if err != nil {
				continue
			}
			if wire.KeyDID(pub) == did {
				return e.snapshot(), true
			}
		}
	}
	return Agent{}, false
}

// authorization is the outcome of authorize.
type authorization struct {
	actor  string
	signed bool
	nonce  string // to record in the write transaction, "" for none
}

// authorize decides whether req may change agent a: its API key, an
// operator (when allowed), or a signature by its current key over obj
// (plus timestamp and nonce). A timestamp and nonce sent along with an API
// key are checked and recorded too.
func (r *Registry) authorize(req *http.Request, a *Agent, p proof, obj map[string]any, allowOperator bool, now time.Time) (authorization, error) {
	c, err := r.identify(req, a.BeamID)
	if err != nil {
		return authorization{}, err
	}
	if c.owner || allowOperator && canMutate(c.operator) {
		az := authorization{actor: c.actor(a.BeamID)}
		if p.timestamp != "" || p.nonce != "" {
			if err := checkFreshness(p, now); err != nil {
				return authorization{}, err
			}
			az.nonce = p.nonce
		}
		return az, nil
	}
	if p.signature != "" {
		if err := r.verifySigned(a, obj, p, now); err != nil {
			return authorization{}, err
		}
		return authorization{actor: "agent:" + a.BeamID, signed: true, nonce: p.nonce}, nil
	}
	return authorization{}, denyCaller(c, "do this; it needs the agent's API key or signature",
		"authentication required: API key or signature")
}

// commit runs operation o (ops.go) with the actor and nonce of az and the
// time now, in one transaction that also writes its audit row.
func (r *Registry) commit(ctx context.Context, az authorization, now time.Time, o *op) error {
	o.At, o.Actor, o.Nonce = micros(now), az.actor, az.nonce
	return r.do(ctx, o)
}

// deleteTx deletes agent beamID's rows and buries its ID.
func deleteTx(ctx context.Context, tx dbtx, beamID, actor string, now time.Time) error {
	for _, q := range []string{
		`DELETE FROM agents WHERE beam_id = ?`,
		`DELETE FROM agent_keys WHERE beam_id = ?`,
		`DELETE FROM intent_acls WHERE target_beam_id = ?`,
		`DELETE FROM used_nonces WHERE scope = ?`,
	} {
		if _, err := tx.ExecContext(ctx, q, beamID); err != nil {
			return fmt.Errorf("delete agent %s: %w", beamID, err)
		}
	}
	// A deleted ID is tombstoned and what others granted it is gone, so
	// nobody can step into it (orgs.go).
	return buryTx(ctx, tx, beamID, actor, now)
}

// handleDelete serves DELETE /agents/{beamId}.
func (r *Registry) handleDelete(w http.ResponseWriter, req *http.Request) error {
	id, err := parseBeamID(req.PathValue("beamId"))
	if err != nil {
		return err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, c, err := r.mutationTarget(req, id.String(), false,
		"delete agents", "deleting an agent needs its API key or an operator")
	if err != nil {
		return err
	}
	now := r.now()
	az := authorization{actor: c.actor(a.BeamID)}
	if err := r.commit(req.Context(), az, now, &op{Kind: opDelete, Target: a.BeamID}); err != nil {
		return err
	}
	r.setAgent(a.BeamID, nil)
	r.bury(a.BeamID)
	r.lg.Info("agent deleted", "beamId", a.BeamID, "actor", az.actor)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleHeartbeat serves POST /agents/{beamId}/heartbeat. Authenticated
// heartbeats (API key or signed headers) update last_seen and return the
// full row; unauthenticated ones return the public view and change nothing.
func (r *Registry) handleHeartbeat(w http.ResponseWriter, req *http.Request) error {
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		return err
	}
	now := r.now()
	c, err := r.identify(req, a.BeamID)
	if err != nil {
		return err
	}
	p := proof{
		timestamp: req.Header.Get(wire.HeaderTimestamp),
		nonce:     req.Header.Get(wire.HeaderNonce),
		signature: req.Header.Get(wire.HeaderSignature),
	}
	nonce := ""
	switch {
	case c.owner:
	case p.signature != "":
		if err := r.verifyHeartbeat(&a, p, now); err != nil {
			return err
		}
		nonce = p.nonce
	default:
		httpjson.Write(w, http.StatusOK, publicViewOf(&a, now))
		return nil
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	cur, err := r.lookup(a.BeamID)
	if err != nil {
		return err
	}
	err = r.do(req.Context(), &op{Kind: opHeartbeat, At: micros(now), Actor: "agent:" + cur.BeamID,
		Target: cur.BeamID, Nonce: nonce})
	if err != nil {
		return err
	}
	if now.After(cur.LastSeen) {
		cur.LastSeen = now
	}
	r.setAgent(cur.BeamID, &cur)
	httpjson.Write(w, http.StatusOK, fullViewOf(&cur, now))
	return nil
}

// verifyHeartbeat checks signed heartbeat headers: canonical (sorted) JSON,
// or the reference's insertion-order JSON of the same object.
func (r *Registry) verifyHeartbeat(a *Agent, p proof, now time.Time) error {
	if err := checkFreshness(p, now); err != nil {
		return err
	}
	if len(p.signature) > 256 {
		return httpjson.Errorf(http.StatusUnauthorized, "INVALID_SIGNATURE", "signature does not verify")
	}
	obj := struct {
		Type      string `json:"type"`
		BeamID    string `json:"beamId"`
		Timestamp string `json:"timestamp"`
		Nonce     string `json:"nonce"`
	}{"heartbeat", a.BeamID, p.timestamp, p.nonce}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // JSON.stringify does not escape <, > and &
	if err := enc.Encode(obj); err != nil {
		return fmt.Errorf("marshal heartbeat: %w", err)
	}
	raw := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if wire.VerifyCanonical(raw, p.signature, a.PublicKey) == nil {
		return nil
	}
	if verifyRaw(raw, p.signature, a.PublicKey) {
		return nil
	}
	return httpjson.Errorf(http.StatusUnauthorized, "INVALID_SIGNATURE", "heartbeat signature does not verify")
}

// verifyRaw checks a base64 Ed25519 signature over msg as is.
func verifyRaw(msg []byte, sigB64 string, pub ed25519.PublicKey) bool {
	sig, err := base64.StdEncoding.DecodeString(sigB64)
	if err != nil || len(sig) != ed25519.SignatureSize || len(pub) != ed25519.PublicKeySize {
		return false
	}
	return ed25519.Verify(pub, msg, sig)
}
