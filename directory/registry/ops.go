package registry

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// Operations. Every registry mutation is one typed operation (op): the
// route authenticates its caller and decides the change, then the
// operation runs (run) in the log's writer transaction. run validates the
// operation's fields with the same functions the routes use and checks it
// against the current rows before it writes anything, so a node applying
// another node's operation (replica.go) decides the same way the origin
// did and never executes anything but these writes. No SQL travels.

// The operation kinds; each is also the action of its audit row.
const (
	opRegister     = "agent.register"
	opReregister   = "agent.reregister"
	opRotate       = "keys.rotate"
	opRevoke       = "keys.revoke"
	opVisibility   = "agent.visibility"
	opConfig       = "agent.config"
	opDelete       = "agent.delete"
	opRelease      = "agent.release"
	opACLCreate    = "acl.create"
	opACLDelete    = "acl.delete"
	opOrgApprove   = "orgs.approve"
	opOrgRevoke    = "orgs.revoke"
	opOrgOwner     = "orgs.owner"
	opNonce        = "request.nonce" // a signed request's nonce (VerifySignedRequest)
	opHeartbeat    = "agent.heartbeat"
	maxOpBytes     = 256 << 10
	maxActorLength = 200
)

// agentOps are the kinds that write an agent's whole row (op.Agent).
var agentOps = map[string]bool{opRegister: true, opReregister: true, opRotate: true, opRevoke: true,
	opVisibility: true, opConfig: true}

// op is one registry operation.
type op struct {
	// ID tells the origin its own operation when it comes back from the
	// cluster's stream (replica.go).
	ID     string `json:"id,omitempty"`
	Kind   string `json:"kind"`
	At     int64  `json:"at"` // the origin's clock, Unix microseconds
	Actor  string `json:"actor"`
	Target string `json:"target"` // the Beam ID the operation is about
	// Nonce is a signed request's nonce, recorded in Target's scope.
	Nonce   string         `json:"nonce,omitempty"`
	Details map[string]any `json:"details,omitempty"` // the audit row's details
	// Agent is the agent's new state (agentOps; nil for a revocation of a
	// key already revoked, which writes nothing but the audit row).
	Agent *agentState `json:"agent,omitempty"`
	// Keys: the key history changed (agentOps).
	Keys bool `json:"keys,omitempty"`
	// Member is a new agent's org membership (register) or the new status
	// (orgs.*); Org the org (orgs.*); Prev the previous owner (orgs.owner).
	Member string `json:"member,omitempty"`
	Org    string `json:"org,omitempty"`
	Prev   string `json:"prev,omitempty"`
	// Rule is the ACL rule to save (acl.create; ID 0 for a new one),
	// RuleID the rule to delete (acl.delete).
	Rule   *ruleRow `json:"rule,omitempty"`
	RuleID int64    `json:"ruleId,omitempty"`

	ruleID int64 // out: the ID of the rule acl.create saved
}

// agentState is an agent's row, key history and settings in an op.
type agentState struct {
	Row         agentRow `json:"row"`
	Keys        []opKey  `json:"keys"`
	RequireSigs bool     `json:"requireSenderSignatures,omitempty"`
	// PipelineHops is acceptAttestedPipelineHops (settings.go).
	PipelineHops bool `json:"acceptAttestedPipelineHops,omitempty"`
}

// opKey is one key of the history (Unix microseconds; RevokedAt 0
// while active).
type opKey struct {
	PublicKey string `json:"publicKey"`
	CreatedAt int64  `json:"createdAt"`
	RevokedAt int64  `json:"revokedAt,omitempty"`
}

func stateOf(a *Agent, now time.Time) *agentState {
	st := &agentState{Row: rowOf(a, now), RequireSigs: a.RequireSenderSignatures, PipelineHops: a.AcceptAttestedPipelineHops}
	for _, k := range a.Keys {
		st.Keys = append(st.Keys, opKey{PublicKey: k.PublicKey, CreatedAt: micros(k.CreatedAt), RevokedAt: micros(k.RevokedAt)})
	}
	return st
}

// agentOf returns the validated agent of st: the fields a registration
// would accept and a key history whose last key is the current one,
// unrevoked, every key an Ed25519 key.
func (r *Registry) agentOf(st *agentState) (*Agent, error) {
	row := st.Row
	id, err := parseBeamID(row.BeamID)
	if err != nil || id.String() != row.BeamID {
		return nil, errors.New("bad Beam ID")
	}
	org := id.Org
	if id.Personal() {
		org = "personal"
	}
	if row.Org != org || row.Personal != id.Personal() {
		return nil, errors.New("org does not match the Beam ID")
	}
	a, err := row.agent()
	if err != nil {
		return nil, err
	}
	if a.PublicKeyB64 != wire.EncodePublicKey(a.PublicKey) {
		return nil, errors.New("public key not in normal form")
	}
	if name, err := validateDisplayName(a.DisplayName); err != nil || name != a.DisplayName {
		return nil, errors.New("bad display name")
	}
	capsJSON, _ := json.Marshal(a.Capabilities)
	if caps, _, err := decodeCapabilities(fields{"capabilities": capsJSON}); err != nil || len(caps) != len(a.Capabilities) {
		return nil, errors.New("bad capabilities")
	}
	checks := []error{
		validateVisibility(a.Visibility),
		validateEndpoint(a.HTTPEndpoint, r.cfg.AllowInsecureEndpoints),
		validateDHKey(a.DHPublicKey),
		validateDescription(a.Description),
		validateWebURL(a.LogoURL, "INVALID_LOGO_URL", "logoUrl"),
		validateWebURL(a.Website, "INVALID_WEBSITE", "website"),
	}
	if a.Email != "" {
		checks = append(checks, validateEmail(a.Email))
	}
	if err := errors.Join(checks...); err != nil {
		return nil, err
	}
	if _, err := hex.DecodeString(a.apiKeyHash); err != nil || len(a.apiKeyHash) != 64 && a.apiKeyHash != "" {
		return nil, errors.New("bad API key digest")
	}
	if len(st.Keys) == 0 || len(st.Keys) > 10000 {
		return nil, errors.New("bad key history")
	}
	seen := map[string]bool{}
	for i, k := range st.Keys {
		pub, err := wire.ParsePublicKey(k.PublicKey)
		if err != nil || wire.EncodePublicKey(pub) != k.PublicKey || seen[k.PublicKey] {
			return nil, errors.New("bad key in the history")
		}
		seen[k.PublicKey] = true
		last := i == len(st.Keys)-1
		if last != (k.RevokedAt == 0) || last && k.PublicKey != a.PublicKeyB64 {
			return nil, errors.New("the current key must be the last, and only it unrevoked")
		}
		a.Keys = append(a.Keys, Key{PublicKey: k.PublicKey, CreatedAt: fromMicros(k.CreatedAt), RevokedAt: fromMicros(k.RevokedAt)})
	}
	a.RequireSenderSignatures = st.RequireSigs
	a.AcceptAttestedPipelineHops = st.PipelineHops
	return a, nil
}

// decodeOp reads a replicated operation: bounded, no unknown fields.
func decodeOp(data []byte) (*op, error) {
	if len(data) > maxOpBytes {
		return nil, fmt.Errorf("operation of %d bytes", len(data))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var o op
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("decode operation: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode operation: trailing data")
	}
	return &o, nil
}

// run validates o against the current state and makes its writes in tx.
// r.writeMu is held, so the in-memory registry is the state of the rows.
func (r *Registry) run(ctx context.Context, tx dbtx, o *op) error {
	if err := r.check(o); err != nil {
		return err
	}
	now := fromMicros(o.At)
	if o.Nonce != "" {
		if err := useNonce(ctx, tx, o.Target, o.Nonce, now); err != nil {
			return err
		}
	}
	var err error
	switch {
	case agentOps[o.Kind]:
		err = r.runAgent(ctx, tx, o, now)
	case o.Kind == opDelete:
		err = deleteTx(ctx, tx, o.Target, o.Actor, now)
	case o.Kind == opRelease:
		_, err = tx.ExecContext(ctx, `DELETE FROM agent_tombstones WHERE beam_id = ?`, o.Target)
	case o.Kind == opACLCreate:
		rule := o.Rule.rule()
		if err = saveRule(ctx, tx, &rule); err == nil {
			o.ruleID = rule.ID
		}
	case o.Kind == opACLDelete:
		_, err = tx.ExecContext(ctx, `DELETE FROM intent_acls WHERE id = ? AND target_beam_id = ?`, o.RuleID, o.Target)
	case o.Kind == opOrgApprove, o.Kind == opOrgRevoke:
		err = putMember(ctx, tx, o.Target, o.Org, o.Member, now, o.Actor)
	case o.Kind == opOrgOwner:
		err = ownerTx(ctx, tx, o, now)
	case o.Kind == opHeartbeat:
		_, err = tx.ExecContext(ctx, `UPDATE agents SET last_seen = MAX(last_seen, ?) WHERE beam_id = ?`, o.At, o.Target)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", o.Kind, o.Target, err)
	}
	if o.Kind == opNonce || o.Kind == opHeartbeat {
		return nil
	}
	return audit(ctx, tx, now, o.Kind, o.Actor, o.Target, o.Details)
}

// errOp is a replicated operation that does not fit the state it is
// applied to.
var errOp = errors.New("registry: invalid operation")

func badOp(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errOp, fmt.Sprintf(format, args...))
}

// check validates o's fields and its preconditions on the current state.
func (r *Registry) check(o *op) error {
	if o.At <= 0 || len(o.Actor) == 0 || len(o.Actor) > maxActorLength || hasControl(o.Actor) {
		return badOp("%s: bad time or actor", o.Kind)
	}
	if o.Nonce != "" && !validNonce(o.Nonce) {
		return badOp("%s: bad nonce", o.Kind)
	}
	if id, err := parseBeamID(o.Target); err != nil || id.String() != o.Target {
		return badOp("%s: bad target", o.Kind)
	}
	cur, exists := r.Get(o.Target)
	switch {
	case agentOps[o.Kind]:
		if o.Agent == nil {
			if o.Kind != opRevoke || !exists {
				return badOp("%s: no agent state", o.Kind)
			}
			return nil
		}
		if o.Agent.Row.BeamID != o.Target {
			return badOp("%s: agent state of another agent", o.Kind)
		}
		a, err := r.agentOf(o.Agent)
		if err != nil {
			return badOp("%s %s: %v", o.Kind, o.Target, err)
		}
		if o.Kind == opRegister {
			// What no client sets starts at its default.
			if a.Verified || a.VerificationTier != "basic" || a.EmailVerified || a.apiKeyHash == "" {
				return badOp("register %s: verification set", o.Target)
			}
			if exists {
				return badOp("register %s: already registered", o.Target)
			}
			if err := r.checkClaim(o.Target); err != nil {
				return err
			}
			switch o.Member {
			case "", memberOwner, memberApproved, memberPending:
			default:
				return badOp("register %s: bad membership %q", o.Target, o.Member)
			}
			r.mu.RLock()
			orgExists := r.orgs[a.Org]
			r.mu.RUnlock()
			if (o.Member == "") != (a.Personal || a.Org == "personal") ||
				o.Member != "" && (o.Member == memberOwner) == orgExists {
				return badOp("register %s: membership does not match its org", o.Target)
			}
			return nil
		}
		if !exists {
			return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "agent %s not found", o.Target)
		}
		// Only a re-registration mints an API key; no client sets the
		// verification.
		if o.Kind != opReregister && a.apiKeyHash != cur.apiKeyHash ||
			a.Verified != cur.Verified || a.VerificationTier != cur.VerificationTier || a.EmailVerified && !cur.EmailVerified {
			return badOp("%s %s: changes what the operation cannot", o.Kind, o.Target)
		}
		// Only a rotation (or a re-registration) changes the current key,
		// and never back to one the agent used before.
		switch {
		case o.Kind == opRotate:
			for _, k := range cur.Keys {
				if k.PublicKey == a.PublicKeyB64 {
					return httpjson.Errorf(http.StatusConflict, "KEY_ALREADY_REVOKED", "this key was used by the agent before and is revoked")
				}
			}
		case o.Kind != opReregister && a.PublicKeyB64 != cur.PublicKeyB64:
			return badOp("%s %s: changes the current key", o.Kind, o.Target)
		}
	case o.Kind == opDelete, o.Kind == opHeartbeat, o.Kind == opNonce:
		if !exists {
			return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "agent %s not found", o.Target)
		}
		if o.Kind == opNonce && o.Nonce == "" {
			return badOp("nonce: none given")
		}
	case o.Kind == opRelease:
		r.mu.RLock()
		dead := r.tombstones[o.Target]
		r.mu.RUnlock()
		if !dead {
			return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "%s is not a deleted Beam ID", o.Target)
		}
	case o.Kind == opACLCreate:
		rl := o.Rule
		if !exists || rl == nil || rl.Target != o.Target || rl.CreatedBy != o.Actor {
			return badOp("acl.create: rule of another agent or none")
		}
		if !validIntentType(rl.IntentType) || !validPattern(rl.AllowedFrom) ||
			rl.Effect != effectAllow && rl.Effect != effectDeny {
			return badOp("acl.create: bad rule")
		}
		existing := r.Rules(o.Target)
		if rl.ID == 0 && len(existing) >= maxRulesPerAgent {
			return httpjson.Errorf(http.StatusConflict, "ACL_LIMIT", "at most %d ACL rules per agent", maxRulesPerAgent)
		}
		if rl.ID != 0 {
			r.mu.RLock()
			old, ok := r.ruleBy[rl.ID]
			r.mu.RUnlock()
			if !ok || old.Target != rl.Target || old.IntentType != rl.IntentType || old.AllowedFrom != rl.AllowedFrom {
				return badOp("acl.create: rule %d is another rule", rl.ID)
			}
		}
	case o.Kind == opACLDelete:
		r.mu.RLock()
		old, ok := r.ruleBy[o.RuleID]
		r.mu.RUnlock()
		if !ok || old.Target != o.Target {
			return httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "ACL rule %d not found", o.RuleID)
		}
	case o.Kind == opOrgApprove, o.Kind == opOrgRevoke:
		want := memberPending
		if o.Kind == opOrgApprove {
			want = memberApproved
		}
		if !exists || cur.Personal || cur.Org != o.Org || o.Member != want {
			return badOp("%s: %s is not in org %q", o.Kind, o.Target, o.Org)
		}
		if r.MemberStatus(o.Target) == memberOwner {
			return httpjson.Errorf(http.StatusConflict, "ORG_OWNER", "%s owns org %s; an operator transfers ownership", o.Target, o.Org)
		}
	case o.Kind == opOrgOwner:
		if !exists || cur.Personal || cur.Org != o.Org || !isOrgLabel(o.Org) || o.Prev != r.orgOwner(o.Org) {
			return badOp("orgs.owner: %s is not in org %q or the owner moved", o.Target, o.Org)
		}
	default:
		return badOp("unknown kind %q", o.Kind)
	}
	return nil
}

// runAgent writes the agent state of an agent operation.
func (r *Registry) runAgent(ctx context.Context, tx dbtx, o *op, now time.Time) error {
	if o.Agent == nil {
		return nil // a revocation of a key already revoked
	}
	a, err := r.agentOf(o.Agent)
	if err != nil {
		return err
	}
	if o.Kind == opRegister {
		if o.Member != "" {
			if err := joinOrgTx(ctx, tx, a, o.Member, now); err != nil {
				return err
			}
		}
		// Key history starts fresh for a new owner, whatever was left.
		if _, err := tx.ExecContext(ctx, `DELETE FROM agent_keys WHERE beam_id = ?`, a.BeamID); err != nil {
			return fmt.Errorf("clear key history: %w", err)
		}
	}
	if err := putAgent(ctx, tx, a, now); err != nil {
		return err
	}
	if o.Keys || o.Kind == opRegister {
		return putKeys(ctx, tx, a)
	}
	return nil
}
