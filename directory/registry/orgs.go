package registry

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// This file holds who may claim which names: the domains a directory
// serves, org membership (who gets same-org rights) and tombstones of
// deleted Beam IDs. docs/SECURITY.md ("Identities and registration") is
// the user-facing description.

// Org membership states (org_members.status).
const (
	// memberOwner controls the org: it approves members. The first
	// registrant of an org becomes its owner; an operator may transfer it.
	memberOwner = "owner"
	// memberApproved is an approved member: same-org rights.
	memberApproved = "member"
	// memberPending registered into an existing org but is not approved:
	// the same-org policy treats it as outside the org.
	memberPending = "pending"
)

var orgSchema = []string{
	`CREATE TABLE IF NOT EXISTS orgs (
		org        TEXT PRIMARY KEY,
		created_at INTEGER NOT NULL,
		created_by TEXT NOT NULL DEFAULT ''
	)`,
	`CREATE TABLE IF NOT EXISTS org_members (
		beam_id    TEXT PRIMARY KEY,
		org        TEXT NOT NULL,
		status     TEXT NOT NULL CHECK (status IN ('owner', 'member', 'pending')),
		updated_at INTEGER NOT NULL,
		updated_by TEXT NOT NULL DEFAULT ''
	)`,
	`CREATE INDEX IF NOT EXISTS org_members_org ON org_members(org, status)`,
	`CREATE TABLE IF NOT EXISTS agent_tombstones (
		beam_id    TEXT PRIMARY KEY,
		deleted_at INTEGER NOT NULL,
		deleted_by TEXT NOT NULL DEFAULT ''
	)`,
}

// orgUpgrade runs once, when the org tables are created in a registry that
// already has agents: each existing org keeps working as before, with its
// oldest agent as owner and every other agent approved.
var orgUpgrade = []string{
	`INSERT OR IGNORE INTO orgs (org, created_at, created_by)
		SELECT org, MIN(created_at), 'upgrade' FROM agents WHERE personal = 0 AND org != 'personal' GROUP BY org`,
	`INSERT OR IGNORE INTO org_members (beam_id, org, status, updated_at, updated_by)
		SELECT beam_id, org, 'member', created_at, 'upgrade' FROM agents WHERE personal = 0 AND org != 'personal'`,
	`UPDATE org_members SET status = 'owner' WHERE beam_id IN (
		SELECT (SELECT a.beam_id FROM agents a WHERE a.org = o.org AND a.personal = 0 ORDER BY a.created_at, a.beam_id LIMIT 1)
		FROM orgs o)`,
}

// migrateOrgs creates the org and tombstone tables (and upgrades an
// existing registry once) inside tx.
func migrateOrgs(ctx context.Context, tx *sqlx.Tx) error {
	var n int
	if err := tx.GetContext(ctx, &n, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'orgs'`); err != nil {
		return fmt.Errorf("look for org tables: %w", err)
	}
	for _, stmt := range orgSchema {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%.40s…: %w", stmt, err)
		}
	}
	if n > 0 {
		return nil
	}
	for _, stmt := range orgUpgrade {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("upgrade orgs: %w", err)
		}
	}
	return nil
}

// loadOrgs reads org membership and tombstones into memory.
func (r *Registry) loadOrgs(ctx context.Context) error {
	db := r.log.ReadDB()
	var orgs []string
	if err := db.SelectContext(ctx, &orgs, `SELECT org FROM orgs`); err != nil {
		return fmt.Errorf("registry: load orgs: %w", err)
	}
	var members []struct {
		BeamID string `db:"beam_id"`
		Status string `db:"status"`
	}
	if err := db.SelectContext(ctx, &members, `SELECT beam_id, status FROM org_members`); err != nil {
		return fmt.Errorf("registry: load org members: %w", err)
	}
	var tombs []string
	if err := db.SelectContext(ctx, &tombs, `SELECT beam_id FROM agent_tombstones`); err != nil {
		return fmt.Errorf("registry: load tombstones: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.orgs = map[string]bool{}
	for _, o := range orgs {
		r.orgs[o] = true
	}
	r.members = map[string]string{}
	for _, m := range members {
		r.members[m.BeamID] = m.Status
	}
	r.tombstones = map[string]bool{}
	for _, t := range tombs {
		r.tombstones[t] = true
	}
	return nil
}

// MemberStatus returns the org membership state of beamID: memberOwner,
// memberApproved, memberPending, or "" for personal agents and unknown IDs.
func (r *Registry) MemberStatus(beamID string) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.members[beamID]
}

// Domain returns the domain this registry serves (Config.Domain).
func (r *Registry) Domain() string { return r.cfg.Domain }

// Serves reports whether this directory may hold beamID: its domain is the
// directory's domain or beneath it, and no pinned peer serves it.
func (r *Registry) Serves(beamID string) bool {
	id, err := wire.ParseBeamID(beamID)
	if err != nil {
		return false
	}
	if beamID == EchoBeamID {
		return true
	}
	d := id.Domain()
	if d != r.cfg.Domain && !strings.HasSuffix(d, "."+r.cfg.Domain) {
		return false
	}
	return r.cfg.Peers == nil || !r.cfg.Peers.IsPeerDomain(d)
}

// checkClaim refuses a new registration of beamID that this directory does
// not serve or that was deleted and not released. r.writeMu is held.
func (r *Registry) checkClaim(beamID string) error {
	if !r.Serves(beamID) {
		return httpjson.Errorf(http.StatusForbidden, "DOMAIN_NOT_SERVED",
			"%s is not in a domain this directory serves (%s and the orgs beneath it, except pinned peers' domains)", beamID, r.cfg.Domain)
	}
	r.mu.RLock()
	dead := r.tombstones[beamID]
	r.mu.RUnlock()
	if dead {
		return httpjson.Errorf(http.StatusConflict, "BEAM_ID_RETIRED",
			"%s was deleted and cannot be registered again unless an operator releases it", beamID)
	}
	return nil
}

// membershipOf is a new agent's org membership: owner for the first
// registrant of an org, approved when the registry's orgs are open,
// pending otherwise; "" for a personal agent.
func (r *Registry) membershipOf(a *Agent) string {
	if a.Personal || a.Org == "" || a.Org == "personal" {
		return ""
	}
	r.mu.RLock()
	exists := r.orgs[a.Org]
	r.mu.RUnlock()
	switch {
	case !exists:
		return memberOwner
	case r.cfg.OpenOrgs:
		return memberApproved
	}
	return memberPending
}

// joinOrgTx records a new agent's org membership status in tx, creating
// the org for its owner.
func joinOrgTx(ctx context.Context, tx dbtx, a *Agent, status string, now time.Time) error {
	if status == memberOwner {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orgs (org, created_at, created_by) VALUES (?, ?, ?)`,
			a.Org, micros(now), a.BeamID); err != nil {
			return fmt.Errorf("create org %s: %w", a.Org, err)
		}
	}
	return putMember(ctx, tx, a.BeamID, a.Org, status, now, "registration")
}

func putMember(ctx context.Context, tx dbtx, beamID, org, status string, now time.Time, by string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO org_members (beam_id, org, status, updated_at, updated_by) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (beam_id) DO UPDATE SET org = excluded.org, status = excluded.status, updated_at = excluded.updated_at, updated_by = excluded.updated_by`,
		beamID, org, status, micros(now), by); err != nil {
		return fmt.Errorf("record membership of %s: %w", beamID, err)
	}
	return nil
}

// setMember updates the cached membership (status "" forgets it).
func (r *Registry) setMember(org, beamID, status string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if org != "" {
		r.orgs[org] = true
	}
	if status == "" {
		delete(r.members, beamID)
		return
	}
	r.members[beamID] = status
}

// orgOwner returns the owner of org, or "".
func (r *Registry) orgOwner(org string) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for id, s := range r.members {
		if s == memberOwner {
			if a, ok := r.agents[id]; ok && a.agent.Org == org {
				return id
			}
		}
	}
	return ""
}

// orgCaller says how a request about org is authorized: as its owner (the
// owner's API key, or a signature by the owner's key over obj) or as a
// mutating operator. It returns the actor and the nonce to record.
func (r *Registry) orgCaller(req *http.Request, org string, p proof, obj map[string]any, now time.Time) (actor, nonce string, err error) {
	owner := r.orgOwner(org)
	if key, ok := apiKeyFrom(req); ok {
		a, ok := r.AuthenticateAPIKey(key)
		if !ok {
			return "", "", httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "invalid API key")
		}
		if owner == "" || a.BeamID != owner {
			return "", "", httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "only the owner of org %s (or an operator) may do this", org)
		}
		return "agent:" + owner, "", nil
	}
	if role, ok := r.operatorRole(req); ok {
		if !canMutate(role) {
			return "", "", httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "operator role %q may not change org membership", role)
		}
		return "operator:" + role, "", nil
	}
	if p.signature != "" && owner != "" {
		a, _ := r.Get(owner)
		if err := r.verifySigned(&a, obj, p, now); err != nil {
			return "", "", err
		}
		return "agent:" + owner, p.nonce, nil
	}
	return "", "", httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED",
		"org membership is managed by the org owner (its API key or signature) or an operator")
}

// orgFromPath validates the {org} path value.
func orgFromPath(req *http.Request) (string, error) {
	org := strings.ToLower(strings.TrimSpace(req.PathValue("org")))
	if !isOrgLabel(org) {
		return "", httpjson.Errorf(http.StatusBadRequest, "INVALID_ORG", "org must be a lowercase label")
	}
	return org, nil
}

// memberView is one entry of GET /orgs/{org}/members.
type memberView struct {
	BeamID string `json:"beamId"`
	Status string `json:"status"`
}

// handleOrgMembers serves GET /orgs/{org}/members (owner or operator).
func (r *Registry) handleOrgMembers(w http.ResponseWriter, req *http.Request) error {
	org, err := orgFromPath(req)
	if err != nil {
		return err
	}
	if key, ok := apiKeyFrom(req); ok {
		a, ok := r.AuthenticateAPIKey(key)
		if !ok || a.BeamID != r.orgOwner(org) {
			return httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "only the owner of org %s (or an operator) may list its members", org)
		}
	} else if _, ok := r.operatorRole(req); !ok {
		return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "listing members needs the org owner's API key or an operator")
	}
	r.mu.RLock()
	out := []memberView{}
	for id, s := range r.members {
		if e, ok := r.agents[id]; ok && e.agent.Org == org {
			out = append(out, memberView{BeamID: id, Status: s})
		}
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].BeamID < out[j].BeamID })
	httpjson.Write(w, http.StatusOK, map[string]any{"org": org, "members": out})
	return nil
}

// handleOrgMemberStatus serves POST /orgs/{org}/members/{beamId}/approve
// and .../revoke: the owner or an operator moves a member between pending
// and approved. A signed request carries {"timestamp","nonce","signature"}
// by the owner's key over {"action":"orgs.approve"|"orgs.revoke","org","beamId"}.
func (r *Registry) handleOrgMemberStatus(approve bool) apiHandler {
	action, status := "orgs.revoke", memberPending
	if approve {
		action, status = "orgs.approve", memberApproved
	}
	return func(w http.ResponseWriter, req *http.Request) error {
		org, err := orgFromPath(req)
		if err != nil {
			return err
		}
		id, err := parseBeamID(req.PathValue("beamId"))
		if err != nil {
			return err
		}
		var p proof
		if req.ContentLength != 0 {
			f, err := readObject(w, req)
			if err != nil {
				return err
			}
			if p, err = f.signed(); err != nil {
				return err
			}
		}
		r.writeMu.Lock()
		defer r.writeMu.Unlock()
		now := r.now()
		actor, nonce, err := r.orgCaller(req, org, p, map[string]any{"action": action, "org": org, "beamId": id.String()}, now)
		if err != nil {
			return err
		}
		a, ok := r.Get(id.String())
		if !ok || a.Org != org || a.Personal {
			return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "%s is not registered in org %s", id.String(), org)
		}
		if r.MemberStatus(a.BeamID) == memberOwner {
			return httpjson.Errorf(http.StatusConflict, "ORG_OWNER", "%s owns org %s; an operator transfers ownership", a.BeamID, org)
		}
		az := authorization{actor: actor, nonce: nonce}
		err = r.commit(req.Context(), az, now, &op{Kind: action, Target: a.BeamID, Details: map[string]any{"org": org},
			Org: org, Member: status})
		if err != nil {
			return err
		}
		r.setMember(org, a.BeamID, status)
		httpjson.Write(w, http.StatusOK, memberView{BeamID: a.BeamID, Status: status})
		return nil
	}
}

// handleOrgOwner serves PUT /orgs/{org}/owner {"beamId"}: an operator
// makes a registered agent of the org its owner (the previous owner stays
// an approved member).
func (r *Registry) handleOrgOwner(w http.ResponseWriter, req *http.Request) error {
	org, err := orgFromPath(req)
	if err != nil {
		return err
	}
	role, ok := r.operatorRole(req)
	if !ok {
		return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "granting org ownership needs an operator")
	}
	if !canMutate(role) {
		return httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "operator role %q may not grant org ownership", role)
	}
	f, err := readObject(w, req)
	if err != nil {
		return err
	}
	s, _, err := f.str("INVALID_BEAM_ID", "beamId")
	if err != nil {
		return err
	}
	id, err := parseBeamID(s)
	if err != nil {
		return err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, ok := r.Get(id.String())
	if !ok || a.Org != org || a.Personal {
		return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "%s is not registered in org %s", id.String(), org)
	}
	now := r.now()
	prev := r.orgOwner(org)
	actor := "operator:" + role
	err = r.commit(req.Context(), authorization{actor: actor}, now, &op{Kind: opOrgOwner, Target: a.BeamID,
		Details: map[string]any{"org": org, "previousOwner": prev}, Org: org, Prev: prev})
	if err != nil {
		return err
	}
	if prev != "" && prev != a.BeamID {
		r.setMember(org, prev, memberApproved)
	}
	r.setMember(org, a.BeamID, memberOwner)
	httpjson.Write(w, http.StatusOK, memberView{BeamID: a.BeamID, Status: memberOwner})
	return nil
}

// handleRelease serves POST /agents/{beamId}/release: an operator lifts
// the tombstone of a deleted Beam ID so that it can be registered again.
func (r *Registry) handleRelease(w http.ResponseWriter, req *http.Request) error {
	id, err := parseBeamID(req.PathValue("beamId"))
	if err != nil {
		return err
	}
	role, ok := r.operatorRole(req)
	if !ok {
		return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "releasing a deleted Beam ID needs an operator")
	}
	if !canMutate(role) {
		return httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "operator role %q may not release Beam IDs", role)
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	dead := r.tombstones[id.String()]
	r.mu.RUnlock()
	if !dead {
		return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "%s is not a deleted Beam ID", id.String())
	}
	err = r.commit(req.Context(), authorization{actor: "operator:" + role}, r.now(), &op{Kind: opRelease, Target: id.String()})
	if err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.tombstones, id.String())
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ownerTx makes o.Target the owner of o.Org (orgs.owner); the previous
// owner o.Prev stays an approved member.
func ownerTx(ctx context.Context, tx dbtx, o *op, now time.Time) error {
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO orgs (org, created_at, created_by) VALUES (?, ?, ?)`,
		o.Org, micros(now), o.Actor); err != nil {
		return fmt.Errorf("create org %s: %w", o.Org, err)
	}
	if o.Prev != "" && o.Prev != o.Target {
		if err := putMember(ctx, tx, o.Prev, o.Org, memberApproved, now, o.Actor); err != nil {
			return err
		}
	}
	return putMember(ctx, tx, o.Target, o.Org, memberOwner, now, o.Actor)
}

// buryTx records the tombstone of a deleted agent in tx and removes what
// others granted to its name: ACL rules that name it as the sender, and
// its org membership.
func buryTx(ctx context.Context, tx dbtx, beamID, actor string, now time.Time) error {
	for _, q := range []string{
		`DELETE FROM intent_acls WHERE allowed_from = ?`,
		`DELETE FROM org_members WHERE beam_id = ?`,
	} {
		if _, err := tx.ExecContext(ctx, q, beamID); err != nil {
			return fmt.Errorf("bury %s: %w", beamID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO agent_tombstones (beam_id, deleted_at, deleted_by) VALUES (?, ?, ?)`,
		beamID, micros(now), actor); err != nil {
		return fmt.Errorf("bury %s: %w", beamID, err)
	}
	return nil
}

// bury updates the cache after buryTx committed.
func (r *Registry) bury(beamID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tombstones[beamID] = true
	delete(r.members, beamID)
	for target, rules := range r.rules {
		kept := rules[:0:0]
		for _, rule := range rules {
			if rule.AllowedFrom == beamID {
				delete(r.ruleBy, rule.ID)
				continue
			}
			kept = append(kept, rule)
		}
		if len(kept) != len(rules) {
			r.rules[target] = kept
		}
	}
}
