package registry

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestACLEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.DefaultPolicy = PolicyDeny })
	owner := b.register("nora@acme.beam.directory")
	other := b.register("otto@beta.beam.directory")
	rule := map[string]any{"targetBeamId": owner.beamID, "intentType": "task.run", "allowedFrom": "*@beta.beam.directory"}

	requireErr(t, b.call("POST", "/acl", rule), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("POST", "/acl", rule, "x-api-key", other.apiKey), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("POST", "/acl", rule, "Authorization", "Bearer "+viewerToken), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("POST", "/acl", rule, "x-api-key", "bk_garbage"), http.StatusUnauthorized, "UNAUTHORIZED")
	ok, _ := b.reg.Allowed(other.beamID, owner.beamID, "task.run")
	require.False(t, ok)

	r := b.call("POST", "/acl", rule, "x-api-key", owner.apiKey)
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	require.Equal(t, owner.beamID, r.body["target_beam_id"])
	require.Equal(t, "task.run", r.body["intent_type"])
	require.Equal(t, "*@beta.beam.directory", r.body["allowed_from"])
	require.Equal(t, "allow", r.body["effect"])
	require.NotEmpty(t, r.body["created_at"])
	id := int64(r.body["id"].(float64))
	ok, reason := b.reg.Allowed(other.beamID, owner.beamID, "task.run")
	require.True(t, ok, reason)
	ok, _ = b.reg.Allowed(other.beamID, owner.beamID, "other.intent")
	require.False(t, ok)

	// Posting the same rule again updates it in place.
	r = b.call("POST", "/acl", map[string]any{"target_beam_id": owner.beamID, "intent_type": "task.run", "allowed_from": "*@beta.beam.directory", "effect": "deny"},
		"Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.EqualValues(t, id, r.body["id"])
	require.Equal(t, "deny", r.body["effect"])
	ok, _ = b.reg.Allowed(other.beamID, owner.beamID, "task.run")
	require.False(t, ok)

	// Signed by the target.
	obj := map[string]any{"action": "acl.create", "targetBeamId": owner.beamID, "intentType": "*", "allowedFrom": other.beamID, "effect": "allow"}
	r = b.call("POST", "/acl", b.sign(owner.priv, obj, "a1", map[string]any{"targetBeamId": owner.beamID, "intentType": "*", "allowedFrom": other.beamID}))
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	sid := int64(r.body["id"].(float64))
	// Signed by someone else.
	requireErr(t, b.call("POST", "/acl", b.sign(other.priv, obj, "a2", map[string]any{"targetBeamId": owner.beamID, "intentType": "*", "allowedFrom": other.beamID})),
		http.StatusUnauthorized, "INVALID_SIGNATURE")

	// Validation.
	for _, c := range []struct {
		body map[string]any
		code string
	}{
		{map[string]any{"targetBeamId": owner.beamID, "intentType": "", "allowedFrom": "*"}, "INVALID_INTENT_TYPE"},
		{map[string]any{"targetBeamId": owner.beamID, "intentType": "x y", "allowedFrom": "*"}, "INVALID_INTENT_TYPE"},
		{map[string]any{"targetBeamId": owner.beamID, "intentType": "x", "allowedFrom": "evil"}, "INVALID_ALLOWED_FROM"},
		{map[string]any{"targetBeamId": owner.beamID, "intentType": "x", "allowedFrom": "*", "effect": "maybe"}, "INVALID_EFFECT"},
		{map[string]any{"targetBeamId": "bad", "intentType": "x", "allowedFrom": "*"}, "INVALID_BEAM_ID"},
		{map[string]any{"intentType": "x", "allowedFrom": "*"}, "INVALID_BEAM_ID"},
		{map[string]any{"targetBeamId": owner.beamID, "intentType": 7, "allowedFrom": "*"}, "INVALID_INTENT_TYPE"},
	} {
		requireErr(t, b.call("POST", "/acl", c.body, "x-api-key", owner.apiKey), http.StatusBadRequest, c.code)
	}
	requireErr(t, b.call("POST", "/acl", map[string]any{"targetBeamId": "ghost@acme.beam.directory", "intentType": "x", "allowedFrom": "*"},
		"Authorization", "Bearer "+operatorToken), http.StatusNotFound, "NOT_FOUND")

	// Listing.
	aclPath := "/acl/" + esc(owner.beamID)
	requireErr(t, b.call("GET", aclPath, nil), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("GET", aclPath, nil, "x-api-key", other.apiKey), http.StatusForbidden, "FORBIDDEN")
	r = b.call("GET", aclPath, nil, "x-api-key", owner.apiKey)
	require.Equal(t, http.StatusOK, r.status)
	require.EqualValues(t, 2, r.body["total"])
	require.Len(t, r.body["acl"], 2)
	r = b.call("GET", aclPath, nil, "Authorization", "Bearer "+viewerToken)
	require.Equal(t, http.StatusOK, r.status)

	// Deleting.
	delPath := fmt.Sprintf("/acl/%d", id)
	requireErr(t, b.call("DELETE", delPath, nil), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("DELETE", delPath, nil, "x-api-key", other.apiKey), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("DELETE", "/acl/abc", nil, "x-api-key", owner.apiKey), http.StatusBadRequest, "INVALID_ID")
	requireErr(t, b.call("DELETE", "/acl/999999", nil, "x-api-key", owner.apiKey), http.StatusNotFound, "NOT_FOUND")
	r = b.call("DELETE", delPath, nil, "x-api-key", owner.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, true, r.body["ok"])
	require.EqualValues(t, id, r.body["id"])
	r = b.call("DELETE", fmt.Sprintf("/acl/%d", sid), nil, "Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Empty(t, b.reg.Rules(owner.beamID))
	require.Zero(t, b.dbInt(`SELECT COUNT(*) FROM intent_acls`))
	require.EqualValues(t, 3, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'acl.create'`))
	require.EqualValues(t, 2, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'acl.delete'`))
}

func TestPolicyEvaluation(t *testing.T) {
	t.Parallel()
	const (
		acmeA   = "a@acme.beam.directory"
		acmeB   = "b@acme.beam.directory"
		betaC   = "c@beta.beam.directory"
		persP   = "p@beam.directory"
		persQ   = "q@beam.directory"
		subAcme = "x@sub.acme.beam.directory" // not a valid Beam ID; patterns still apply
	)
	rule := func(id int64, intent, from, effect string) Rule {
		return Rule{ID: id, Target: acmeA, IntentType: intent, AllowedFrom: from, Effect: effect}
	}
	cases := []struct {
		name   string
		policy Policy
		rules  []Rule
		from   string
		to     string
		intent string
		want   bool
	}{
		{"same-org same org", PolicySameOrg, nil, acmeB, acmeA, "x", true},
		{"same-org other org", PolicySameOrg, nil, betaC, acmeA, "x", false},
		{"same-org personal sender", PolicySameOrg, nil, persP, acmeA, "x", false},
		{"same-org personal to personal", PolicySameOrg, nil, persP, persQ, "x", false},
		{"same-org garbage sender", PolicySameOrg, nil, "garbage", acmeA, "x", false},
		{"allow default", PolicyAllow, nil, betaC, acmeA, "x", true},
		{"deny default", PolicyDeny, nil, acmeB, acmeA, "x", false},
		{"deny rule beats same org", PolicySameOrg, []Rule{rule(1, "x", acmeB, "deny")}, acmeB, acmeA, "x", false},
		{"deny rule other intent", PolicySameOrg, []Rule{rule(1, "y", acmeB, "deny")}, acmeB, acmeA, "x", true},
		{"deny wildcard intent", PolicyAllow, []Rule{rule(1, "*", "*", "deny")}, betaC, acmeA, "anything", false},
		{"deny beats allow", PolicyAllow, []Rule{rule(1, "x", "*", "allow"), rule(2, "x", betaC, "deny")}, betaC, acmeA, "x", false},
		{"allow exact", PolicyDeny, []Rule{rule(1, "x", betaC, "allow")}, betaC, acmeA, "x", true},
		{"allow exact other sender", PolicyDeny, []Rule{rule(1, "x", betaC, "allow")}, acmeB, acmeA, "x", false},
		{"allow star", PolicyDeny, []Rule{rule(1, "x", "*", "allow")}, persP, acmeA, "x", true},
		{"allow domain suffix", PolicyDeny, []Rule{rule(1, "x", "*@beta.beam.directory", "allow")}, betaC, acmeA, "x", true},
		{"domain suffix no match", PolicyDeny, []Rule{rule(1, "x", "*@beta.beam.directory", "allow")}, acmeB, acmeA, "x", false},
		{"personal domain suffix", PolicyDeny, []Rule{rule(1, "x", "*@beam.directory", "allow")}, persP, acmeA, "x", true},
		{"personal domain suffix excludes orgs", PolicyDeny, []Rule{rule(1, "x", "*@beam.directory", "allow")}, betaC, acmeA, "x", false},
		{"dot suffix", PolicyDeny, []Rule{rule(1, "x", "*.acme.beam.directory", "allow")}, subAcme, acmeA, "x", true},
		{"dot suffix no match", PolicyDeny, []Rule{rule(1, "x", "*.acme.beam.directory", "allow")}, betaC, acmeA, "x", false},
		{"dot suffix in the middle", PolicyDeny, []Rule{rule(1, "x", "*.acme.beam.directory", "allow")}, "m@x.acme.beam.directory.evil.example", acmeA, "x", false},
		{"dot suffix is not the org itself", PolicyDeny, []Rule{rule(1, "x", "*.acme.beam.directory", "allow")}, acmeB, acmeA, "x", false},
		{"dot suffix deny in the middle", PolicyAllow, []Rule{rule(1, "x", "*.beam", "deny")}, betaC, acmeA, "x", true},
		{"allow wildcard intent", PolicyDeny, []Rule{rule(1, "*", betaC, "allow")}, betaC, acmeA, "whatever", true},
		{"allow other intent falls back", PolicyDeny, []Rule{rule(1, "y", betaC, "allow")}, betaC, acmeA, "x", false},
	}
	for _, c := range cases {
		got, reason := evaluate(c.rules, c.policy, c.from, c.to, c.intent)
		require.Equal(t, c.want, got, "%s: %s", c.name, reason)
		require.NotEmpty(t, reason)
	}
}

func TestValidPattern(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"*", "a@beam.directory", "a@acme.beam.directory", "*@acme.beam.directory", "*.acme.beam.directory", "*@beam.directory"} {
		require.True(t, validPattern(p), p)
	}
	for _, p := range []string{"", "evil", "*@", "*.", "**", "*@ACME", "a@example.com", "*@a b"} {
		require.False(t, validPattern(p), p)
	}
}
