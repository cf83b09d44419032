package registry

import (
	"context"
	"net/http"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// TestRequireSenderSignaturesSetting: the agent turns the setting on with
// a signed config change that covers it; a body that adds it to a
// signature made without it is refused; it survives a restart; a new
// registration of a deleted Beam ID starts from the default.
func TestRequireSenderSignaturesSetting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("sig@acme.beam.directory")
	cfg := "/agents/" + esc(a.beamID) + "/config"
	got, _ := b.reg.Get(a.beamID)
	require.False(t, got.RequireSenderSignatures, "off by default")

	// A signature over an endpoint change cannot be stretched to turn the
	// setting on (the signed object would have to include it).
	obj := map[string]any{"action": "agents.config", "beamId": a.beamID, "httpEndpoint": nil, "dhPublicKey": nil}
	stretched := b.sign(a.priv, obj, "s1", map[string]any{"requireSenderSignatures": true})
	requireErr(t, b.call("PATCH", cfg, stretched), http.StatusUnauthorized, "INVALID_SIGNATURE")

	on := map[string]any{"action": "agents.config", "beamId": a.beamID, "httpEndpoint": nil, "dhPublicKey": nil,
		"requireSenderSignatures": true}
	r := b.call("PATCH", cfg, b.sign(a.priv, on, "s2", map[string]any{"requireSenderSignatures": true}))
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, true, r.body["requireSenderSignatures"])
	got, _ = b.reg.Get(a.beamID)
	require.True(t, got.RequireSenderSignatures)
	require.NotContains(t, b.call("GET", "/agents/"+esc(a.beamID), nil).body, "requireSenderSignatures",
		"anonymous views do not show settings")

	requireErr(t, b.call("PATCH", cfg, map[string]any{"requireSenderSignatures": "yes"}, "x-api-key", a.apiKey),
		http.StatusBadRequest, "INVALID_BODY")

	b.reopen()
	got, _ = b.reg.Get(a.beamID)
	require.True(t, got.RequireSenderSignatures, "kept across a restart")

	r = b.call("PATCH", cfg, map[string]any{"requireSenderSignatures": false}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	got, _ = b.reg.Get(a.beamID)
	require.False(t, got.RequireSenderSignatures)
	require.EqualValues(t, 2, b.dbInt(`SELECT COUNT(*) FROM audit_log WHERE action = 'agent.config'`))

	// A deleted agent's setting does not come back with a new owner of the
	// Beam ID.
	r = b.call("PATCH", cfg, map[string]any{"requireSenderSignatures": true}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	r = b.call("DELETE", "/agents/"+esc(a.beamID), nil, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusNoContent, r.status, string(r.raw))
	require.Equal(t, http.StatusNoContent, b.call("POST", "/agents/"+esc(a.beamID)+"/release", nil,
		"Authorization", "Bearer "+operatorToken).status)
	b.register(a.beamID)
	b.reopen()
	got, _ = b.reg.Get(a.beamID)
	require.False(t, got.RequireSenderSignatures)
}

// TestAcceptAttestedPipelineHopsSetting: the agent turns it on with its API
// key, it survives a restart, and a settings table made before the
// setting existed gets its column (off) when the registry opens.
func TestAcceptAttestedPipelineHopsSetting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("hops@acme.beam.directory")
	cfg := "/agents/" + esc(a.beamID) + "/config"
	got, _ := b.reg.Get(a.beamID)
	require.False(t, got.AcceptAttestedPipelineHops, "off by default")

	r := b.call("PATCH", cfg, map[string]any{"acceptAttestedPipelineHops": true}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, true, r.body["acceptAttestedPipelineHops"])
	b.reopen()
	got, _ = b.reg.Get(a.beamID)
	require.True(t, got.AcceptAttestedPipelineHops, "kept across a restart")

	// The table of an earlier version, without the column.
	_, err := b.log.Do(context.Background(), func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`ALTER TABLE agent_settings DROP COLUMN accept_attested_pipeline_hops`)
		return err
	})
	require.NoError(t, err)
	b.reopen()
	got, _ = b.reg.Get(a.beamID)
	require.False(t, got.AcceptAttestedPipelineHops)
	r = b.call("PATCH", cfg, map[string]any{"acceptAttestedPipelineHops": true}, "x-api-key", a.apiKey)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
}
