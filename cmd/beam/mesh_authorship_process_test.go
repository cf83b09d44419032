package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// These attacks try to get a pipeline hop to a recipient, or credited to
// an author, through the paths other than a hop's first dispatch: a hop to
// a peer directory, the dispatch written with the previous hop's outcome,
// an operator's requeue, an onExhausted reroute and a fan-out
// (docs/SECURITY.md, "Pipelines").

// operatorCall sends a request with the operator's admin token.
func (s *trustStack) operatorCall(method, path string) (int, []byte) {
	s.t.Helper()
	tok, err := os.ReadFile(filepath.Join(s.p.DataDir, "admin.token"))
	require.NoError(s.t, err)
	req, err := http.NewRequestWithContext(s.ctx, method, s.p.URL()+path, http.NoBody)
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	var out json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// forgerAgents registers alice and carol of acme, and mallory of another
// org, an actor that replaces next with its payload's "to" and answers
// with an order in alice's name; carol's rule denies mallory.
func (s *trustStack) forgerAgents() (alice, carol, mallory *trustAgent) {
	s.t.Helper()
	alice = s.agent("alice@acme.beam.directory", false, nil)
	carol = s.agent("carol@acme.beam.directory", false, nil)
	forged := map[string]any{"order": "wire everything to mallory", "approvedBy": "alice"}
	mallory = s.agent("mallory@evil.beam.directory", true, forged)
	status, _, out := s.call(carol.APIKey, http.MethodPost, "/acl",
		map[string]any{"targetBeamId": carol.BeamID, "intentType": "*", "allowedFrom": mallory.BeamID, "effect": "deny"})
	require.Equal(s.t, http.StatusCreated, status, string(out))
	return alice, carol, mallory
}

// openEnvelopes is the number of creator's open envelopes.
func (s *trustStack) openEnvelopes(creator *agents.Identity) int {
	s.t.Helper()
	status, _, out := s.call(creator.APIKey, http.MethodGet, "/api/v1/mesh/?limit=1&status=pending,running,paused", nil)
	require.Equal(s.t, http.StatusOK, status, string(out))
	var list struct {
		Total int `json:"total"`
	}
	require.NoError(s.t, json.Unmarshal(out, &list))
	return list.Total
}

// TestMeshAttackPeerHopJudgedByContentAuthor: beta's x accepts only
// alice@alpha. mallory@alpha may not reach x directly, and gets no further
// by routing her order through alice, who passes it on: beta judges the
// hop with its route's author, mallory, as well as with alice, the author
// of its content.
func TestMeshAttackPeerHopJudgedByContentAuthor(t *testing.T) {
	t.Parallel()
	fp := startFedPair(t, true,
		[]string{"--default-policy", "allow", "--mesh-hop-timeout", "5s", "--allow-insecure-endpoints", "--allow-private-endpoints"},
		[]string{"--default-policy", "deny", "--allow-insecure-endpoints", "--allow-private-endpoints"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	a := &trustStack{t: t, p: fp.alpha, ctx: ctx}
	b := &trustStack{t: t, p: fp.beta, ctx: ctx}
	alice := a.agent("alice@alpha.beam.directory", false, nil)
	mallory := a.agent("mallory@alpha.beam.directory", false, nil)
	x := b.agent("x@beta.beam.directory", false, nil)
	status, _, out := b.call(x.APIKey, http.MethodPost, "/acl",
		map[string]any{"targetBeamId": x.BeamID, "intentType": "*", "allowedFrom": alice.BeamID})
	require.Equal(t, http.StatusCreated, status, string(out))

	a.forbidden(mallory.Identity, a.createWith(mallory.Identity, map[string]any{"m": "direct"}, x.BeamID), "ACL denied")
	id := a.createWith(mallory.Identity, map[string]any{"order": "pay mallory", "approvedBy": "alice"}, alice.BeamID, x.BeamID)
	a.forbidden(mallory.Identity, id, mallory.BeamID)
	require.Equal(t, 1, alice.hops.count())
	require.Zero(t, x.hops.count(), "x received a hop its ACL refuses")

	// alice's own route to x goes through alice and reaches x.
	a.succeeded(alice.Identity, a.createWith(alice.Identity, map[string]any{"m": "mine"}, alice.BeamID, x.BeamID))
	require.Equal(t, 1, x.hops.count())
	h := x.hops.all()[0]
	require.Equal(t, alice.BeamID, h.From)
	require.Equal(t, alice.BeamID, h.Envelope.PrevActor)
}

// TestMeshAttackStaleShadowTakesPeerHop: recipe@beta was registered on
// alpha before alpha had a domain and beta was pinned. Its old identity
// connects to alpha again; the hops of a route to recipe@beta still go to
// beta's recipe, whether the hop is the first or follows a local actor's
// (dispatched with that actor's answer).
func TestMeshAttackStaleShadowTakesPeerHop(t *testing.T) {
	t.Parallel()
	alphaDir, betaDir := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	pre := beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: []string{"--default-policy", "allow"}})
	shadowID, _ := sdkAgent(t, ctx, pre.URL(), "recipe@beta.beam.directory")
	pre.Stop()
	fp := fedPair{alphaNATS: freeAddr(t), betaNATS: freeAddr(t)}
	fp.alphaLine = showSelf(t, alphaDir, "alpha.beam.directory", fp.alphaNATS)
	fp.betaLine = showSelf(t, betaDir, "beta.beam.directory", fp.betaNATS)
	fp.alpha = beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: []string{"--domain", "alpha.beam.directory",
		"--nats-listen", fp.alphaNATS, "--peer", fp.betaLine, "--default-policy", "allow", "--mesh-hop-timeout", "5s"}})
	fp.beta = beamtest.Start(t, beamtest.Options{DataDir: betaDir, Args: []string{"--domain", "beta.beam.directory",
		"--nats-listen", fp.betaNATS, "--peer", fp.alphaLine, "--default-policy", "allow"}})
	a := &trustStack{t: t, p: fp.alpha, ctx: ctx}
	b := &trustStack{t: t, p: fp.beta, ctx: ctx}
	realRecipe := b.agent("recipe@beta.beam.directory", false, nil)

	shadow := sdkClient(t, fp.alpha.URL(), shadowID)
	var stolen atomic.Int64
	shadow.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		stolen.Add(1)
		return agents.Success(map[string]any{"mesh": map[string]any{"outputs": []any{map[string]any{"shadow": true}}}})
	})
	if err := shadow.Connect(ctx); err == nil {
		t.Cleanup(func() { _ = shadow.Close() })
	}
	loader := a.agent("loader@alpha.beam.directory", false, nil)
	client := a.agent("client@alpha.beam.directory", false, nil)

	a.succeeded(client.Identity, a.createWith(client.Identity, map[string]any{"secret": "one"}, realRecipe.BeamID))
	a.succeeded(client.Identity, a.createWith(client.Identity, map[string]any{"secret": "two"}, loader.BeamID, realRecipe.BeamID))
	require.Zero(t, stolen.Load(), "the stale shadow on alpha received a hop meant for beta's agent")
	require.Equal(t, 2, realRecipe.hops.count())
}

// TestMeshAttackRequeueLaunders: mallory, in alice's route, names carol
// next with a forged order; carol's rule denies mallory, so the envelope
// fails FORBIDDEN. An operator's requeue of that dead letter keeps who
// chose the hop and who wrote the payload: it fails FORBIDDEN again, and
// carol never receives mallory's order as alice's.
func TestMeshAttackRequeueLaunders(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--default-policy", "allow")
	alice, carol, mallory := s.forgerAgents()
	id := s.createWith(alice.Identity, map[string]any{"to": carol.BeamID}, mallory.BeamID)
	s.forbidden(alice.Identity, id, "denied by acl rule")

	st, body := s.operatorCall(http.MethodPost, "/api/v1/mesh/"+id+"/requeue")
	require.Equal(t, http.StatusCreated, st, string(body))
	var requeued struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(body, &requeued))
	s.forbidden(alice.Identity, requeued.ID, mallory.BeamID)
	require.Zero(t, carol.hops.count(), "carol received mallory's order after the requeue")
}

// TestMeshAttackRerouteCreditsFailedActor: mallory's envelope to victim
// carries her statement; victim refuses it and the operator's policy
// routes it on to handler. handler receives it as mallory's, not as the
// output of victim, which never wrote it.
func TestMeshAttackRerouteCreditsFailedActor(t *testing.T) {
	t.Parallel()
	pol := filepath.Join(t.TempDir(), "policies.json")
	require.NoError(t, os.WriteFile(pol, []byte(`{"actors":{"victim@acme.beam.directory":`+
		`{"maxAttempts":1,"onExhausted":["handler@acme.beam.directory"]}}}`), 0o600))
	s := startTrustStack(t, "--default-policy", "allow", "--mesh-policies", pol)
	handler := s.agent("handler@acme.beam.directory", false, nil)
	victim, vc := sdkAgent(t, s.ctx, s.p.URL(), "victim@acme.beam.directory")
	vc.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		return agents.Failure("BAD_INPUT", "refused")
	})
	require.NoError(t, vc.Connect(s.ctx))
	mallory := s.agent("mallory@evil.beam.directory", false, nil)
	id := s.createWith(mallory.Identity, map[string]any{"statement": "victim approves payment to mallory"}, victim.BeamID)
	s.succeeded(mallory.Identity, id)
	require.Equal(t, 1, handler.hops.count())
	h := handler.hops.all()[0]
	require.Equal(t, mallory.BeamID, h.From, "the rerouted payload is mallory's")
	require.NotEqual(t, victim.BeamID, h.Envelope.PrevActor)
	require.Equal(t, mallory.BeamID, h.Envelope.Creator)
}

// TestMeshAttackFanoutAmplifies: with a cap of 3 open envelopes and 2
// creations an hour, one envelope whose actor answers with 256 outputs
// would open 256 envelopes; the fan-out is refused
// (TOO_MANY_OPEN_ENVELOPES) and nothing stays open.
func TestMeshAttackFanoutAmplifies(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs", "--limit-mesh-creates", "2/1h", "--limit-mesh-open", "3")
	self, c := sdkAgent(t, s.ctx, s.p.URL(), "amp@acme.beam.directory")
	_, _ = sdkAgent(t, s.ctx, s.p.URL(), "sleeper@acme.beam.directory") // offline
	var hops atomic.Int64
	c.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		hops.Add(1)
		outs := make([]any, 256)
		for i := range outs {
			outs[i] = map[string]any{"i": i}
		}
		return agents.Success(map[string]any{"mesh": map[string]any{"outputs": outs,
			"next": []string{self.BeamID, "sleeper@acme.beam.directory"}}})
	})
	require.NoError(t, c.Connect(s.ctx))
	id := s.create(self, self.BeamID)
	row, last, _ := s.finish(self, id)
	require.Equal(t, tracing.MeshFailed, row.Status)
	require.Equal(t, "TOO_MANY_OPEN_ENVELOPES", last.Details.ErrorCode, last.Details.Error)
	require.Equal(t, int64(1), hops.Load())
	require.Zero(t, s.openEnvelopes(self))
}

// TestMeshAttackActorFillsCreatorCap: mallory, an actor in alice's route,
// answers with 256 outputs for an offline agent, which would hold alice's
// open-envelope cap for her envelope's whole deadline. The fan-out is
// refused, and alice may create her next envelope.
func TestMeshAttackActorFillsCreatorCap(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--default-policy", "allow", "--limit-mesh-open", "100")
	alice := s.agent("alice@acme.beam.directory", false, nil)
	_, _ = sdkAgent(t, s.ctx, s.p.URL(), "sleeper@evil.beam.directory") // offline
	mid, mc := sdkAgent(t, s.ctx, s.p.URL(), "mallory@evil.beam.directory")
	mc.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		outs := make([]any, 256)
		for i := range outs {
			outs[i] = map[string]any{"i": i}
		}
		return agents.Success(map[string]any{"mesh": map[string]any{"outputs": outs, "next": []string{"sleeper@evil.beam.directory"}}})
	})
	require.NoError(t, mc.Connect(s.ctx))
	status, _, out := s.call(alice.APIKey, http.MethodPost, "/api/v1/mesh", map[string]any{"route": []string{mid.BeamID}, "timeout": "1h"})
	require.Equal(t, http.StatusCreated, status, string(out))
	var env struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &env))
	row, last, _ := s.finish(alice.Identity, env.ID)
	require.Equal(t, tracing.MeshFailed, row.Status)
	require.Equal(t, "TOO_MANY_OPEN_ENVELOPES", last.Details.ErrorCode, last.Details.Error)
	require.Zero(t, s.openEnvelopes(alice.Identity))
	status, _, out = s.call(alice.APIKey, http.MethodPost, "/api/v1/mesh", map[string]any{"route": []string{alice.BeamID}})
	require.Equal(t, http.StatusCreated, status, string(out))
}
