package registry

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/beamdir/beam/internal/httpjson"
)

// maxRulesPerAgent bounds the ACL of one target.
const maxRulesPerAgent = 1000

// handleACLCreate serves POST /acl.
func (r *Registry) handleACLCreate(w http.ResponseWriter, req *http.Request) error {
	f, err := readObject(w, req)
	if err != nil {
		return err
	}
	target, ok, err := f.str("INVALID_BEAM_ID", "targetBeamId", "target_beam_id")
	if err != nil {
		return err
	}
	if !ok {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_BEAM_ID", "targetBeamId is required")
	}
	tid, err := parseBeamID(target)
	if err != nil {
		return err
	}
	intent, _, err := f.str("INVALID_INTENT_TYPE", "intentType", "intent_type")
	if err != nil {
		return err
	}
	from, _, err := f.str("INVALID_ALLOWED_FROM", "allowedFrom", "allowed_from")
	if err != nil {
		return err
	}
	effect, effectGiven, err := f.str("INVALID_EFFECT", "effect")
	if err != nil {
		return err
	}
	p, err := f.signed()
	if err != nil {
		return err
	}

	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, _, err := r.mutationTarget(req, tid.String(), p.signature != "",
		"change ACLs", "ACL changes need the target agent's API key, its signature, or an operator")
	if err != nil {
		return err
	}
	intent = strings.TrimSpace(intent)
	if !validIntentType(intent) {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_INTENT_TYPE", "intentType must be an intent name or *")
	}
	from = strings.ToLower(strings.TrimSpace(from))
	if !validPattern(from) {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_ALLOWED_FROM", "allowedFrom must be *, a Beam ID, *@domain or *.suffix")
	}
	if !effectGiven || effect == "" {
		effect = effectAllow
	}
	if effect != effectAllow && effect != effectDeny {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_EFFECT", "effect must be allow or deny")
	}
	now := r.now()
	az, err := r.authorize(req, &a, p, map[string]any{
		"action": "acl.create", "targetBeamId": a.BeamID, "intentType": intent, "allowedFrom": from, "effect": effect,
	}, true, now)
	if err != nil {
		return err
	}
	existing := r.Rules(a.BeamID)
	if len(existing) >= maxRulesPerAgent {
		return httpjson.Errorf(http.StatusConflict, "ACL_LIMIT", "at most %d ACL rules per agent", maxRulesPerAgent)
	}
	rule := Rule{Target: a.BeamID, IntentType: intent, AllowedFrom: from, Effect: effect, CreatedAt: now, CreatedBy: az.actor}
	status := http.StatusCreated
	for _, e := range existing {
		if e.IntentType == intent && e.AllowedFrom == from {
			rule.ID, rule.CreatedAt = e.ID, e.CreatedAt
			status = http.StatusOK
		}
	}
	o := &op{Kind: opACLCreate, Target: a.BeamID, Rule: rowOfRule(rule),
		Details: map[string]any{"intentType": intent, "allowedFrom": from, "effect": effect}}
	if err := r.commit(req.Context(), az, now, o); err != nil {
		return err
	}
	rule.ID = o.ruleID
	r.putRule(rule)
	httpjson.Write(w, status, ruleViewOf(rule))
	return nil
}

// saveRule updates the effect of an existing rule (ID set) or inserts a new
// one and sets its ID.
func saveRule(ctx context.Context, tx dbtx, rule *Rule) error {
	if rule.ID != 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE intent_acls SET effect = ?, created_by = ? WHERE id = ?`,
			rule.Effect, rule.CreatedBy, rule.ID); err != nil {
			return fmt.Errorf("update acl rule: %w", err)
		}
		return nil
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO intent_acls
		(target_beam_id, intent_type, allowed_from, effect, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?)`,
		rule.Target, rule.IntentType, rule.AllowedFrom, rule.Effect, micros(rule.CreatedAt), rule.CreatedBy)
	if err != nil {
		return fmt.Errorf("insert acl rule: %w", err)
	}
	if rule.ID, err = res.LastInsertId(); err != nil {
		return fmt.Errorf("insert acl rule: %w", err)
	}
	return nil
}

// rowOfRule is rule as its row.
func rowOfRule(rule Rule) *ruleRow {
	return &ruleRow{ID: rule.ID, Target: rule.Target, IntentType: rule.IntentType, AllowedFrom: rule.AllowedFrom,
		Effect: rule.Effect, CreatedAt: micros(rule.CreatedAt), CreatedBy: rule.CreatedBy}
}

// putRule adds or replaces a rule in the cache.
func (r *Registry) putRule(rule Rule) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.rules[rule.Target]
	next := make([]Rule, 0, len(old)+1)
	replaced := false
	for _, e := range old {
		if e.ID == rule.ID {
			next = append(next, rule)
			replaced = true
			continue
		}
		next = append(next, e)
	}
	if !replaced {
		next = append(next, rule)
	}
	r.rules[rule.Target] = next
	r.ruleBy[rule.ID] = rule
}

// dropRule removes a rule from the cache.
func (r *Registry) dropRule(rule Rule) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.rules[rule.Target]
	next := make([]Rule, 0, len(old))
	for _, e := range old {
		if e.ID != rule.ID {
			next = append(next, e)
		}
	}
	if len(next) == 0 {
		delete(r.rules, rule.Target)
	} else {
		r.rules[rule.Target] = next
	}
	delete(r.ruleBy, rule.ID)
}

// handleACLList serves GET /acl/{beamId} to the agent itself or an operator.
func (r *Registry) handleACLList(w http.ResponseWriter, req *http.Request) error {
	id, err := parseBeamID(req.PathValue("beamId"))
	if err != nil {
		return err
	}
	c, err := r.identify(req, id.String())
	if err != nil {
		return err
	}
	if !c.owner && c.operator == "" {
		return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "reading an ACL needs the agent's API key or an operator")
	}
	if _, err := r.lookup(id.String()); err != nil {
		return err
	}
	rules := r.Rules(id.String())
	views := make([]ruleView, 0, len(rules))
	for _, rule := range rules {
		views = append(views, ruleViewOf(rule))
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"acl": views, "total": len(views)})
	return nil
}

// handleACLDelete serves DELETE /acl/{id}.
func (r *Registry) handleACLDelete(w http.ResponseWriter, req *http.Request) error {
	_, hasKey := apiKeyFrom(req)
	_, isOperator := r.operatorRole(req)
	if !hasKey && !isOperator {
		return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "deleting an ACL rule needs the target agent's API key or an operator")
	}
	id, err := strconv.ParseInt(req.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_ID", "rule id must be a positive integer")
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	rule, ok := r.ruleBy[id]
	r.mu.RUnlock()
	if !ok {
		return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "ACL rule %d not found", id)
	}
	c, err := r.identify(req, rule.Target)
	if err != nil {
		return err
	}
	if !c.owner && !canMutate(c.operator) {
		return httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "only the rule's target agent or an operator may delete it")
	}
	now := r.now()
	az := authorization{actor: c.actor(rule.Target)}
	err = r.commit(req.Context(), az, now, &op{Kind: opACLDelete, Target: rule.Target, RuleID: rule.ID,
		Details: map[string]any{"id": rule.ID, "intentType": rule.IntentType, "allowedFrom": rule.AllowedFrom, "effect": rule.Effect}})
	if err != nil {
		return err
	}
	r.dropRule(rule)
	httpjson.Write(w, http.StatusOK, map[string]any{"ok": true, "id": rule.ID})
	return nil
}
