package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// The attacks these tests stop use a pipeline to get around what an
// agent's own intents cannot: an envelope's hops obey every actor's policy
// with the hop's actual author as the sender, name who wrote their
// content, are bounded per creator, and report delivery failures without
// the server's transport detail (docs/SECURITY.md, "Pipelines").

// trustStack is a beam serve for the pipeline attack tests.
type trustStack struct {
	t   *testing.T
	p   *beamtest.Process
	ctx context.Context
}

func startTrustStack(t *testing.T, args ...string) *trustStack {
	t.Helper()
	p := beamtest.Start(t, beamtest.Options{Args: append([]string{"--mesh-hop-timeout", "5s",
		"--allow-insecure-endpoints", "--allow-private-endpoints"}, args...)})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &trustStack{t: t, p: p, ctx: ctx}
}

// deliveredHop is one hop as an actor received it: the frame's from and
// the envelope it carried.
type deliveredHop struct {
	From     string
	Envelope struct {
		ID        string           `json:"id"`
		Route     agents.MeshRoute `json:"route"`
		Payload   json.RawMessage  `json:"payload"`
		Creator   string           `json:"creator"`
		PrevActor string           `json:"prev_actor"`
	}
}

// hopLog records the hops one actor received.
type hopLog struct {
	mu   sync.Mutex
	hops []deliveredHop
}

func (l *hopLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.hops)
}

func (l *hopLog) all() []deliveredHop {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]deliveredHop(nil), l.hops...)
}

// trustAgent is a registered agent, its client and the hops it received.
type trustAgent struct {
	*agents.Identity
	c    *agents.Client
	hops *hopLog
}

// agent registers beamID and connects it as a pipeline actor that records
// every hop and answers with out (nil: the payload it got). When rewrite
// is set it replaces next with the payload's "to".
func (s *trustStack) agent(beamID string, rewrite bool, out any) *trustAgent {
	s.t.Helper()
	id, c := sdkAgent(s.t, s.ctx, s.p.URL(), beamID)
	a := &trustAgent{Identity: id, c: c, hops: &hopLog{}}
	// A plain handler of the hop's intent sees the frame as delivered.
	c.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		var h deliveredHop
		h.From = in.From
		if err := json.Unmarshal(in.Payload, &h.Envelope); err != nil {
			return agents.Failure(agents.MeshPermanentCode, err.Error())
		}
		a.hops.mu.Lock()
		a.hops.hops = append(a.hops.hops, h)
		a.hops.mu.Unlock()
		output := any(h.Envelope.Payload)
		if out != nil {
			output = out
		}
		reply := map[string]any{"outputs": []any{output}}
		if rewrite {
			var p struct {
				To string `json:"to"`
			}
			_ = json.Unmarshal(h.Envelope.Payload, &p)
			reply["next"] = []string{p.To}
		}
		return agents.Success(map[string]any{"mesh": reply})
	})
	require.NoError(s.t, c.Connect(s.ctx))
	return a
}

// call sends a request with key as the agent's API key.
func (s *trustStack) call(key, method, path string, body any) (int, http.Header, []byte) {
	s.t.Helper()
	var rd io.Reader = http.NoBody
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(s.t, err)
		rd = strings.NewReader(string(raw))
	}
	req, err := http.NewRequestWithContext(s.ctx, method, s.p.URL()+path, rd)
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, resp.Header, out
}

// create posts an envelope with route as creator and returns its id.
func (s *trustStack) create(creator *agents.Identity, route ...string) string {
	s.t.Helper()
	return s.createWith(creator, map[string]any{"from": creator.BeamID}, route...)
}

// createWith is create with payload.
func (s *trustStack) createWith(creator *agents.Identity, payload any, route ...string) string {
	s.t.Helper()
	status, _, out := s.call(creator.APIKey, http.MethodPost, "/api/v1/mesh",
		map[string]any{"route": route, "payload": payload})
	require.Equal(s.t, http.StatusCreated, status, string(out))
	var res struct {
		ID string `json:"id"`
	}
	require.NoError(s.t, json.Unmarshal(out, &res))
	return res.ID
}

// row reads envelope envID as its creator sees it.
func (s *trustStack) row(creator *agents.Identity, envID string) tracing.MeshRow {
	s.t.Helper()
	status, _, out := s.call(creator.APIKey, http.MethodGet, "/api/v1/mesh/"+envID, nil)
	require.Equal(s.t, http.StatusOK, status, string(out))
	var row tracing.MeshRow
	require.NoError(s.t, json.Unmarshal(out, &row))
	return row
}

// waitingOffline waits until envelope envID waits for its offline actor
// and returns its row.
func (s *trustStack) waitingOffline(creator *agents.Identity, envID string) tracing.MeshRow {
	s.t.Helper()
	var row tracing.MeshRow
	require.Eventually(s.t, func() bool {
		row = s.row(creator, envID)
		return row.State == tracing.Queued && row.Reason == "actor offline"
	}, 10*time.Second, 20*time.Millisecond, "envelope %s waits for its actor", envID)
	return row
}

// connectSink connects c as an actor that ends every route (no outputs).
func (s *trustStack) connectSink(c *agents.Client) {
	s.t.Helper()
	c.Handle(agents.MeshIntent, func(ctx context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]any{"mesh": map[string]any{"outputs": []any{}}})
	})
	require.NoError(s.t, c.Connect(s.ctx))
}

// finish waits until the envelope is terminal and returns its row and
// the last event of its trace, as its creator sees them.
func (s *trustStack) finish(creator *agents.Identity, envID string) (tracing.MeshRow, tracing.Event, string) {
	s.t.Helper()
	var row tracing.MeshRow
	require.Eventually(s.t, func() bool {
		row = s.row(creator, envID)
		return row.Status.Terminal()
	}, 30*time.Second, 20*time.Millisecond, "envelope %s finishes", envID)
	status, _, out := s.call(creator.APIKey, http.MethodGet, "/api/v1/mesh/"+envID+"/trace", nil)
	require.Equal(s.t, http.StatusOK, status, string(out))
	var tr struct {
		Events []tracing.Event `json:"events"`
	}
	require.NoError(s.t, json.Unmarshal(out, &tr))
	require.NotEmpty(s.t, tr.Events)
	return row, tr.Events[len(tr.Events)-1], string(out)
}

// forbidden asserts that envelope envID failed FORBIDDEN with a reason
// containing why.
func (s *trustStack) forbidden(creator *agents.Identity, envID, why string) {
	s.t.Helper()
	row, last, _ := s.finish(creator, envID)
	require.Equal(s.t, tracing.MeshFailed, row.Status, "envelope %s", envID)
	require.Equal(s.t, "FORBIDDEN", last.Details.ErrorCode, "envelope %s: %s", envID, last.Details.Error)
	require.Contains(s.t, last.Details.Error, why)
}

// succeeded asserts that envelope envID went through its route.
func (s *trustStack) succeeded(creator *agents.Identity, envID string) {
	s.t.Helper()
	row, last, _ := s.finish(creator, envID)
	require.Equal(s.t, tracing.MeshSucceeded, row.Status, "envelope %s: %s", envID, last.Details.Error)
}

// TestMeshAttackHopIgnoresRecipientPolicy: an agent that may not send
// to bob (another org under the same-org default, a pending member of
// bob's org, a sender bob's rule denies) gets no hop to bob through a
// pipeline either, not as the first actor nor later in the route; an
// agent that requires sender signatures gets attested hops only once it
// accepts them. Each refusal fails the envelope FORBIDDEN.
func TestMeshAttackHopIgnoresRecipientPolicy(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t)
	bob := s.agent("bob@acme.beam.directory", false, nil)
	mallory := s.agent("mallory@evil.beam.directory", false, nil)
	eve := s.agent("eve@acme.beam.directory", false, nil) // pending: bob owns acme

	// Mallory's own intent to bob is refused by the relay.
	_, err := mallory.c.Send(s.ctx, bob.BeamID, "conversation.message", map[string]any{"message": "hi"})
	require.Equal(t, "FORBIDDEN", agents.ErrorCode(err), "%v", err)

	// The same through a pipeline: curr bob, and bob after mallory's own hop.
	s.forbidden(mallory.Identity, s.create(mallory.Identity, bob.BeamID), "same-org")
	s.forbidden(mallory.Identity, s.create(mallory.Identity, mallory.BeamID, bob.BeamID), "same-org")
	// A pending member of bob's org has no same-org rights either.
	s.forbidden(eve.Identity, s.create(eve.Identity, bob.BeamID), "not an approved member")
	require.Zero(t, bob.hops.count(), "bob received no hop")

	// An explicit deny rule holds against a rule that allows everyone.
	dan := s.agent("dan@other.beam.directory", false, nil)
	trent := s.agent("trent@else.beam.directory", false, nil)
	for _, rule := range []map[string]any{
		{"targetBeamId": dan.BeamID, "intentType": "*", "allowedFrom": "*"},
		{"targetBeamId": dan.BeamID, "intentType": "*", "allowedFrom": mallory.BeamID, "effect": "deny"},
	} {
		status, _, out := s.call(dan.APIKey, http.MethodPost, "/acl", rule)
		require.Equal(t, http.StatusCreated, status, string(out))
	}
	s.forbidden(mallory.Identity, s.create(mallory.Identity, dan.BeamID), "denied by acl rule")
	s.succeeded(trent.Identity, s.create(trent.Identity, dan.BeamID))
	require.Equal(t, 1, dan.hops.count())

	// Dan requires sender signatures: no agent signs a hop.
	status, _, out := s.call(dan.APIKey, http.MethodPatch, "/agents/"+dan.BeamID+"/config", map[string]any{"requireSenderSignatures": true})
	require.Equal(t, http.StatusOK, status, string(out))
	s.forbidden(trent.Identity, s.create(trent.Identity, dan.BeamID), "requireSenderSignatures")
	require.Equal(t, 1, dan.hops.count())
	// Until it accepts attested pipeline hops.
	status, _, out = s.call(dan.APIKey, http.MethodPatch, "/agents/"+dan.BeamID+"/config", map[string]any{"acceptAttestedPipelineHops": true})
	require.Equal(t, http.StatusOK, status, string(out))
	require.Contains(t, string(out), `"acceptAttestedPipelineHops":true`)
	s.succeeded(trent.Identity, s.create(trent.Identity, dan.BeamID))
	require.Equal(t, 2, dan.hops.count())
}

// TestMeshAttackActorSpeaksAsCreator: an actor of another org that
// rewrites next may not make the next actor receive its output as the
// creator's. The hop is from the actor, the envelope names creator and
// previous actor apart, and the next actor's policy is applied to the
// actor that chose the hop: carol's rule denying mallory stops it.
func TestMeshAttackActorSpeaksAsCreator(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--default-policy", "allow")
	alice, carol, mallory := s.forgerAgents()
	dave := s.agent("dave@acme.beam.directory", false, nil)
	// Alice may reach carol herself (carol answers she has no handler).
	_, err := alice.c.Send(s.ctx, carol.BeamID, "conversation.message", map[string]any{"message": "hi"})
	require.Equal(t, "UNSUPPORTED_INTENT", agents.ErrorCode(err), "%v", err)

	// Mallory rewrites next to dave: dave learns it is mallory's content.
	s.succeeded(alice.Identity, s.createWith(alice.Identity, map[string]any{"to": dave.BeamID}, mallory.BeamID))
	hops := dave.hops.all()
	require.Len(t, hops, 1)
	require.Equal(t, mallory.BeamID, hops[0].From, "the hop is from its content's author")
	require.Equal(t, alice.BeamID, hops[0].Envelope.Creator)
	require.Equal(t, mallory.BeamID, hops[0].Envelope.PrevActor)
	require.JSONEq(t, `{"order":"wire everything to mallory","approvedBy":"alice"}`, string(hops[0].Envelope.Payload))

	// To carol, who denies mallory: the hop mallory chose never reaches her.
	s.forbidden(alice.Identity, s.createWith(alice.Identity, map[string]any{"to": carol.BeamID}, mallory.BeamID), "denied by acl rule")
	require.Zero(t, carol.hops.count())
	// The route alice gave still reaches carol, from alice.
	s.succeeded(alice.Identity, s.create(alice.Identity, carol.BeamID))
	require.Equal(t, alice.BeamID, carol.hops.all()[0].From)
}

// TestMeshAttackEnvelopeFlood: an agent cannot create envelopes without
// bound: a rate per creator and a cap of open envelopes per creator, both
// answered 429 with Retry-After.
func TestMeshAttackEnvelopeFlood(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs", "--limit-mesh-creates", "4/1h", "--limit-mesh-open", "2")
	creator, _ := sdkAgent(t, s.ctx, s.p.URL(), "client@acme.beam.directory")
	workerID := "worker@acme.beam.directory"
	_, wc := sdkAgent(t, s.ctx, s.p.URL(), workerID)
	post := func() (int, http.Header, string) {
		status, hdr, out := s.call(creator.APIKey, http.MethodPost, "/api/v1/mesh", map[string]any{"route": []string{workerID}})
		return status, hdr, string(out)
	}
	retryAfter := func(hdr http.Header) {
		ra, err := strconv.Atoi(hdr.Get("Retry-After"))
		require.NoError(t, err)
		require.Positive(t, ra)
	}

	// The open-envelope cap: two open (the worker is offline), the third refused.
	first, second := s.create(creator, workerID), s.create(creator, workerID)
	status, hdr, out := post()
	require.Equal(t, http.StatusTooManyRequests, status, out)
	require.Contains(t, out, `"errorCode":"TOO_MANY_OPEN_ENVELOPES"`)
	retryAfter(hdr)

	s.connectSink(wc)
	s.succeeded(creator, first)
	s.succeeded(creator, second)

	// The creation rate, 4 an hour: the refused request counted too.
	status, _, out = post()
	require.Equal(t, http.StatusCreated, status, out)
	status, hdr, out = post()
	require.Equal(t, http.StatusTooManyRequests, status, out)
	require.Contains(t, out, `"errorCode":"RATE_LIMITED"`)
	retryAfter(hdr)
}

// TestMeshAttackOfflineActorLogWrites: an envelope waiting for an actor
// that is offline writes nothing to the log while it waits (one wait
// step, due at the deadline), and the actor connecting wakes it.
func TestMeshAttackOfflineActorLogWrites(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs")
	creator, _ := sdkAgent(t, s.ctx, s.p.URL(), "client@acme.beam.directory")
	workerID := "worker@acme.beam.directory"
	_, wc := sdkAgent(t, s.ctx, s.p.URL(), workerID)
	envID := s.create(creator, workerID)
	row := s.waitingOffline(creator, envID)
	require.Equal(t, row.DeadlineAt, row.NextAt, "the wait is due at the deadline, not in a second")
	neverWithin(t, 2500*time.Millisecond, 100*time.Millisecond,
		func() bool { return s.row(creator, envID).LastSeq != row.LastSeq }, "no log write while the actor is offline")

	s.connectSink(wc)
	s.succeeded(creator, envID)
}

// TestMeshAttackDeliveryErrorLeaksTransport: a hop whose direct HTTP
// delivery fails tells the creator the relay's category, never the
// server's transport detail (addresses, resolver, dial errors).
func TestMeshAttackDeliveryErrorLeaksTransport(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs")
	// A loopback port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	endpoint := "http://" + ln.Addr().String() + "/hook"
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())

	creator, _ := sdkAgent(t, s.ctx, s.p.URL(), "client@acme.beam.directory")
	hookID := "hook@acme.beam.directory"
	hook, _ := sdkAgent(t, s.ctx, s.p.URL(), hookID)
	status, _, out := s.call(hook.APIKey, http.MethodPatch, "/agents/"+hookID+"/config", map[string]any{"httpEndpoint": endpoint})
	require.Equal(t, http.StatusOK, status, string(out))

	envID := s.create(creator, hookID)
	row, last, trace := s.finish(creator, envID)
	require.Equal(t, tracing.MeshFailed, row.Status)
	require.Equal(t, "DIRECT_HTTP_FAILED", last.Details.ErrorCode, last.Details.Error)
	require.Contains(t, last.Details.Error, "endpoint could not be reached")
	_, _, view := s.call(creator.APIKey, http.MethodGet, "/api/v1/mesh/"+envID, nil)
	for _, leak := range []string{"dial", "connection refused", "127.0.0.1", ":" + port, "lookup", "Post "} {
		require.NotContains(t, trace, leak)
		require.NotContains(t, string(view), leak)
	}
}

// TestMeshOfflineActorWokenAfterRestart: the envelopes waiting for an
// offline actor are known again after a restart, so the actor connecting
// to the new process wakes them (they are not left until their deadline).
func TestMeshOfflineActorWokenAfterRestart(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs")
	creator, _ := sdkAgent(t, s.ctx, s.p.URL(), "client@acme.beam.directory")
	worker, _ := sdkAgent(t, s.ctx, s.p.URL(), "worker@acme.beam.directory")
	envID := s.create(creator, worker.BeamID)
	s.waitingOffline(creator, envID)

	s.p.Restart()
	wc := sdkClient(t, s.p.URL(), worker)
	s.connectSink(wc)
	s.succeeded(creator, envID)
}

// TestMeshEventsOutliveTheWriteTimeout: an envelope's SSE stream lasts as
// long as the envelope, not as long as the server's write timeout lets a
// response run.
func TestMeshEventsOutliveTheWriteTimeout(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs", "--write-timeout=1s")
	creator, _ := sdkAgent(t, s.ctx, s.p.URL(), "client@acme.beam.directory")
	sdkAgent(t, s.ctx, s.p.URL(), "worker@acme.beam.directory") // registered, never connected
	envID := s.create(creator, "worker@acme.beam.directory")
	req, err := http.NewRequestWithContext(s.ctx, http.MethodGet, s.p.URL()+"/api/v1/mesh/"+envID+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", creator.APIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	require.True(t, sc.Scan(), "the stream opens")
	// The condition is the passing of the write timeout itself.
	<-time.After(1500 * time.Millisecond)
	status, _, out := s.call(creator.APIKey, http.MethodPost, "/api/v1/mesh/"+envID+"/cancel", nil)
	require.Equal(t, http.StatusOK, status, string(out))
	var last string
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			last = d
		}
	}
	require.Contains(t, last, `"status":"canceled"`, "the stream was cut before the envelope ended")
}
