package registry

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// A stream entry is a typed operation, validated on apply like the route's
// request: SQL text, an unknown kind, an operation that does not fit the
// current state (a registration of a taken Beam ID with another API key
// digest, a key history whose current key is not its last) are skipped
// and counted, and the next valid entry still applies.
func TestApplyRefusesEntriesThatAreNotValidOperations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := b.register("alice@acme.beam.directory")
	ctx := context.Background()
	cur, ok := b.reg.Get(alice.beamID)
	require.True(t, ok)

	_, stolenHash, err := newAPIKey(alice.beamID)
	require.NoError(t, err)
	taken := cur
	taken.apiKeyHash = stolenHash
	noCurrent := cur
	noCurrent.Keys = []Key{{PublicKey: newIdentity(t).pubB64, CreatedAt: b.clock.Now()}}
	now := b.clock.Now()
	bad := []any{
		map[string]any{"stmts": []map[string]any{{"q": "UPDATE agents SET api_key_hash = ?", "a": []map[string]any{{"s": stolenHash}}}}},
		op{Kind: "sql", At: micros(now), Actor: "x", Target: alice.beamID},
		op{Kind: opRegister, At: micros(now), Actor: "anonymous", Target: alice.beamID, Agent: stateOf(&taken, now), Member: memberOwner},
		op{Kind: opRotate, At: micros(now), Actor: "agent:" + alice.beamID, Target: alice.beamID, Agent: stateOf(&noCurrent, now), Keys: true},
	}
	for i, e := range bad {
		data, err := json.Marshal(e)
		require.NoError(t, err)
		require.NoError(t, b.reg.Apply(ctx, uint64(i+1), data))
	}
	require.EqualValues(t, len(bad), b.reg.Rejected())
	require.EqualValues(t, len(bad), b.reg.Applied())
	got, _ := b.reg.Get(alice.beamID)
	require.Equal(t, cur.apiKeyHash, got.apiKeyHash)
	_, ok = b.reg.AuthenticateAPIKey(alice.apiKey)
	require.True(t, ok)

	// A valid operation after them applies.
	vis := cur
	vis.Visibility = visibilityUnlisted
	data, err := json.Marshal(op{Kind: opVisibility, At: micros(now), Actor: "operator:admin", Target: alice.beamID, Agent: stateOf(&vis, now)})
	require.NoError(t, err)
	require.NoError(t, b.reg.Apply(ctx, uint64(len(bad)+1), data))
	got, _ = b.reg.Get(alice.beamID)
	require.Equal(t, visibilityUnlisted, got.Visibility)
	require.EqualValues(t, len(bad), b.reg.Rejected())
}

// FuzzApplyOperation: whatever a stream entry holds, Apply neither panics
// nor fails; it applies the entry or skips it, and the position moves on.
func FuzzApplyOperation(f *testing.F) {
	b := setup(f)
	alice := b.register("alice@acme.beam.directory")
	cur, _ := b.reg.Get(alice.beamID)
	now := b.clock.Now()
	for _, seed := range []any{
		op{Kind: opVisibility, At: micros(now), Actor: "operator:admin", Target: alice.beamID, Agent: stateOf(&cur, now)},
		op{Kind: opDelete, At: micros(now), Actor: "operator:admin", Target: alice.beamID},
		op{Kind: opACLCreate, At: micros(now), Actor: "operator:admin", Target: alice.beamID,
			Rule: &ruleRow{Target: alice.beamID, IntentType: "*", AllowedFrom: "*", Effect: effectAllow, CreatedBy: "operator:admin"}},
		map[string]any{"stmts": []map[string]any{{"q": "DELETE FROM agents"}}},
	} {
		data, err := json.Marshal(seed)
		require.NoError(f, err)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		seq := b.reg.Applied() + 1
		require.NoError(t, b.reg.Apply(context.Background(), seq, data))
		require.Equal(t, seq, b.reg.Applied())
	})
}

// An agent.config operation carries every setting of the agent, so a node
// applying it ends with the settings the origin's request set.
func TestConfigOperationCarriesEverySetting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := b.register("alice@acme.beam.directory")
	cur, ok := b.reg.Get(alice.beamID)
	require.True(t, ok)
	require.False(t, cur.RequireSenderSignatures)
	require.False(t, cur.AcceptAttestedPipelineHops)

	next := cur
	next.RequireSenderSignatures = true
	next.AcceptAttestedPipelineHops = true
	now := b.clock.Now()
	data, err := json.Marshal(op{Kind: opConfig, At: micros(now), Actor: "agent:" + alice.beamID, Target: alice.beamID, Agent: stateOf(&next, now)})
	require.NoError(t, err)
	require.NoError(t, b.reg.Apply(context.Background(), b.reg.Applied()+1, data))
	require.Zero(t, b.reg.Rejected())
	got, _ := b.reg.Get(alice.beamID)
	require.True(t, got.RequireSenderSignatures)
	require.True(t, got.AcceptAttestedPipelineHops)
}
