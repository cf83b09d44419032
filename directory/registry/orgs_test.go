package registry

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Anyone could register into any org and get same-org rights, so
// intruder@bigcorp reached ceo@bigcorp under the default policy. Now the
// first registrant owns the org and later ones wait for approval.
func TestOrgMembershipNeedsApproval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ceo := b.register("ceo@bigcorp.beam.directory")
	id := newIdentity(t)
	r := b.call("POST", "/agents/register", map[string]any{"beamId": "intruder@bigcorp.beam.directory", "displayName": "I", "publicKey": id.pubB64})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	require.Equal(t, memberPending, r.str("orgMembership"), "the registrant is told it is pending")
	intruder := agent{identity: id, beamID: "intruder@bigcorp.beam.directory", apiKey: r.str("apiKey")}
	require.Equal(t, memberOwner, b.reg.MemberStatus(ceo.beamID))
	require.Equal(t, memberPending, b.reg.MemberStatus(intruder.beamID))

	ok, reason := b.reg.Allowed(intruder.beamID, ceo.beamID, "task.run")
	require.False(t, ok, reason)
	require.Contains(t, reason, "not an approved member")
	ok, _ = b.reg.Allowed(ceo.beamID, intruder.beamID, "task.run")
	require.False(t, ok, "a pending member is outside the org both ways")

	// The intruder cannot approve itself, nor can a viewer.
	approve := "/orgs/bigcorp/members/" + esc(intruder.beamID) + "/approve"
	requireErr(t, b.call("POST", approve, nil, "x-api-key", intruder.apiKey), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("POST", approve, nil), http.StatusUnauthorized, "UNAUTHORIZED")
	requireErr(t, b.call("POST", approve, nil, "Authorization", "Bearer "+viewerToken), http.StatusForbidden, "FORBIDDEN")
	requireErr(t, b.call("GET", "/orgs/bigcorp/members", nil, "x-api-key", intruder.apiKey), http.StatusForbidden, "FORBIDDEN")

	// The owner approves with its API key: same-org rights follow.
	r = b.call("POST", approve, nil, "x-api-key", ceo.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	ok, reason = b.reg.Allowed(intruder.beamID, ceo.beamID, "task.run")
	require.True(t, ok, reason)
	r = b.call("GET", "/orgs/bigcorp/members", nil, "x-api-key", ceo.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Len(t, r.body["members"], 2)

	// A signed revoke by the owner's key takes the rights away again; the
	// signature cannot be replayed.
	revoke := "/orgs/bigcorp/members/" + esc(intruder.beamID) + "/revoke"
	body := b.sign(ceo.priv, map[string]any{"action": "orgs.revoke", "org": "bigcorp", "beamId": intruder.beamID}, "rv-1", map[string]any{})
	r = b.call("POST", revoke, body)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, memberPending, b.reg.MemberStatus(intruder.beamID))
	require.NotEqual(t, http.StatusOK, b.call("POST", revoke, body).status)

	// An operator approves and transfers ownership; state survives a restart.
	newOwner := b.register("cto@bigcorp.beam.directory")
	r = b.call("PUT", "/orgs/bigcorp/owner", map[string]any{"beamId": newOwner.beamID}, "x-api-key", ceo.apiKey)
	require.Equal(t, http.StatusUnauthorized, r.status, "only an operator grants ownership")
	r = b.call("PUT", "/orgs/bigcorp/owner", map[string]any{"beamId": newOwner.beamID}, "Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	b.reopen()
	require.Equal(t, memberOwner, b.reg.MemberStatus(newOwner.beamID))
	require.Equal(t, memberApproved, b.reg.MemberStatus(ceo.beamID))
	require.Equal(t, memberPending, b.reg.MemberStatus(intruder.beamID))
	requireErr(t, b.call("POST", approve, nil, "x-api-key", ceo.apiKey), http.StatusForbidden, "FORBIDDEN")
}

// With OpenOrgs every registrant is a member at once (trusted private
// directories); the first is still the owner.
func TestOpenOrgs(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.OpenOrgs = true })
	a := b.register("a@open.beam.directory")
	c := b.register("c@open.beam.directory")
	require.Equal(t, memberOwner, b.reg.MemberStatus(a.beamID))
	require.Equal(t, memberApproved, b.reg.MemberStatus(c.beamID))
	ok, reason := b.reg.Allowed(c.beamID, a.beamID, "x")
	require.True(t, ok, reason)
}

// A deleted Beam ID is tombstoned: a newcomer cannot register it, and the
// grants others gave to the name are gone, so even after an operator
// releases it the newcomer holds none of them.
func TestDeletedIDInheritsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.DefaultPolicy = PolicyDeny })
	alice := b.register("alice@acme.beam.directory")
	bob := b.register("bob@acme.beam.directory")
	r := b.call("POST", "/acl", map[string]any{"targetBeamId": bob.beamID, "intentType": "*", "allowedFrom": alice.beamID}, "x-api-key", bob.apiKey)
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	ok, _ := b.reg.Allowed(alice.beamID, bob.beamID, "x")
	require.True(t, ok)

	require.Equal(t, http.StatusNoContent, b.call("DELETE", "/agents/"+esc(alice.beamID), nil, "x-api-key", alice.apiKey).status)
	newcomer := newIdentity(t)
	body := map[string]any{"beamId": alice.beamID, "displayName": "Not Alice", "publicKey": newcomer.pubB64}
	requireErr(t, b.call("POST", "/agents/register", body), http.StatusConflict, "BEAM_ID_RETIRED")
	// An ID derived from a display name skips the retired one.
	gen := b.call("POST", "/agents/register", map[string]any{"displayName": "Alice", "org": "acme", "publicKey": newIdentity(t).pubB64})
	require.Equal(t, http.StatusCreated, gen.status, string(gen.raw))
	require.Equal(t, "alice-2@acme.beam.directory", gen.str("beamId"))
	b.reopen()
	requireErr(t, b.call("POST", "/agents/register", body), http.StatusConflict, "BEAM_ID_RETIRED")

	requireErr(t, b.call("POST", "/agents/"+esc(alice.beamID)+"/release", nil, "x-api-key", bob.apiKey), http.StatusUnauthorized, "UNAUTHORIZED")
	require.Equal(t, http.StatusNoContent, b.call("POST", "/agents/"+esc(alice.beamID)+"/release", nil, "Authorization", "Bearer "+operatorToken).status)
	r = b.call("POST", "/agents/register", body)
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	ok, reason := b.reg.Allowed(alice.beamID, bob.beamID, "x")
	require.False(t, ok, "the newcomer must not hold bob's grant to the old alice: %s", reason)
	require.Zero(t, b.dbInt(`SELECT COUNT(*) FROM intent_acls WHERE allowed_from = ?`, alice.beamID))
}

// A directory registers Beam IDs only in the domain it serves and never in
// a pinned peer's domain, so nobody can shadow a peer's agent locally.
func TestRegistrationOnlyInServedDomains(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Domain = "alpha.beam.directory" })
	b.register("a@alpha.beam.directory")
	for _, id := range []string{"b@beta.beam.directory", "x@beam.directory", "ceo@bigcorp.beam.directory"} {
		body := map[string]any{"beamId": id, "displayName": "Impostor", "publicKey": newIdentity(t).pubB64}
		requireErr(t, b.call("POST", "/agents/register", body), http.StatusForbidden, "DOMAIN_NOT_SERVED")
	}
	// A generated ID lands in the directory's domain.
	r := b.call("POST", "/agents/register", map[string]any{"displayName": "Gen", "publicKey": newIdentity(t).pubB64})
	require.Equal(t, http.StatusCreated, r.status, string(r.raw))
	require.Equal(t, "gen@alpha.beam.directory", r.str("beamId"))

	// The default domain serves personal IDs and every org, except the
	// domains of pinned peers.
	d := setup(t, func(c *Config) { c.Peers = peerDomain("beta.beam.directory") })
	d.register("x@beam.directory")
	d.register("y@acme.beam.directory")
	body := map[string]any{"beamId": "b@beta.beam.directory", "displayName": "Impostor", "publicKey": newIdentity(t).pubB64}
	requireErr(t, d.call("POST", "/agents/register", body), http.StatusForbidden, "DOMAIN_NOT_SERVED")
}

// peerDomain is the one domain a pinned peer serves, as federation's
// Router answers for it.
type peerDomain string

func (p peerDomain) IsPeerDomain(domain string) bool { return domain == string(p) }

func (p peerDomain) LookupRemote(context.Context, string) (RemoteKey, bool) {
	return RemoteKey{}, false
}
