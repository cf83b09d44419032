package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// clusterPipelines: an envelope belongs to the node that created it, its
// hops reach actors connected to any node (handed to the node holding the
// actor's session), and its creator reaches it through any node: get,
// list, trace, pause, resume, cancel and the event stream.
func clusterPipelines(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	on := func(t *testing.T, i int) *trustStack { return &trustStack{t: t, p: nodes[i], ctx: ctx} }
	creator := on(t, 0).agent("mesh-creator@"+clusterDomain, false, nil)
	first := on(t, 1).agent("mesh-first@"+clusterDomain, false, nil)
	second := on(t, 2).agent("mesh-second@"+clusterDomain, false, nil)

	t.Run("RunsThroughActorsOnOtherNodes", func(t *testing.T) {
		id := on(t, 0).create(creator.Identity, first.BeamID, second.BeamID)
		on(t, 0).succeeded(creator.Identity, id)
		require.Len(t, first.hops.all(), 1)
		hops := second.hops.all()
		require.Len(t, hops, 1)
		require.Equal(t, first.BeamID, hops[0].From, "the second hop carries the first actor's output")
		require.Equal(t, creator.BeamID, hops[0].Envelope.Creator)

		// Back to the first actor's node: each hop is a hand-over of its
		// own, never a replay of the envelope's earlier hop there.
		back := on(t, 0).create(creator.Identity, first.BeamID, second.BeamID, first.BeamID)
		on(t, 0).succeeded(creator.Identity, back)
		require.Len(t, first.hops.all(), 3)
		require.Equal(t, second.BeamID, first.hops.all()[2].From)

		// Read through the other nodes: the same envelope, its trace, and
		// the lists, which merge every node's envelopes.
		for _, i := range []int{1, 2} {
			row := on(t, i).row(creator.Identity, id)
			require.Equal(t, tracing.MeshSucceeded, row.Status)
			_, _, tr := on(t, i).finish(creator.Identity, id)
			require.Contains(t, tr, `"dispatched"`)
		}
		other := on(t, 2).create(creator.Identity, second.BeamID)
		on(t, 2).succeeded(creator.Identity, other)
		status, _, out := on(t, 1).call(creator.APIKey, http.MethodGet, "/api/v1/mesh?limit=10", nil)
		require.Equal(t, http.StatusOK, status, string(out))
		var list struct {
			Messages []tracing.MeshRow `json:"messages"`
			Total    int               `json:"total"`
		}
		require.NoError(t, json.Unmarshal(out, &list))
		require.Equal(t, 3, list.Total)
		require.Len(t, list.Messages, 3)
		require.Equal(t, other, list.Messages[0].ID, "newest first across nodes")
		require.Equal(t, back, list.Messages[1].ID)
		require.Equal(t, id, list.Messages[2].ID)
		status, _, out = on(t, 1).call(creator.APIKey, http.MethodGet, "/api/v1/mesh?limit=1&offset=2", nil)
		require.Equal(t, http.StatusOK, status, string(out))
		require.NoError(t, json.Unmarshal(out, &list))
		require.Len(t, list.Messages, 1)
		require.Equal(t, id, list.Messages[0].ID)

		// Another agent does not learn that the envelope exists, on any node.
		for _, i := range []int{0, 1, 2} {
			status, _, out := on(t, i).call(second.APIKey, http.MethodGet, "/api/v1/mesh/"+id, nil)
			require.Equal(t, http.StatusNotFound, status, string(out))
		}
	})

	t.Run("ControlFromAnotherNode", func(t *testing.T) {
		idle, _ := sdkAgent(t, ctx, nodes[0].URL(), "mesh-idle@"+clusterDomain) // never connects
		id := on(t, 0).create(creator.Identity, idle.BeamID)
		on(t, 0).waitingOffline(creator.Identity, id)
		for _, step := range []struct {
			path string
			want tracing.MeshStatus
		}{{"/pause", tracing.MeshPaused}, {"/resume", ""}, {"/cancel", tracing.MeshCanceled}} {
			status, _, out := on(t, 1).call(creator.APIKey, http.MethodPost, "/api/v1/mesh/"+id+step.path, nil)
			require.Equal(t, http.StatusOK, status, "%s through node 1: %s", step.path, out)
			if step.want != "" {
				require.Equal(t, step.want, on(t, 2).row(creator.Identity, id).Status, step.path)
			} else {
				require.NotEqual(t, tracing.MeshPaused, on(t, 2).row(creator.Identity, id).Status)
			}
		}
	})

	t.Run("OperatorThroughAnotherNode", func(t *testing.T) {
		id := on(t, 0).create(creator.Identity, first.BeamID)
		on(t, 0).succeeded(creator.Identity, id)
		token, err := os.ReadFile(filepath.Join(nodes[2].DataDir, "admin.token"))
		require.NoError(t, err)
		get := func(path string) []byte {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodes[2].URL()+path, nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			out, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, out)
			return out
		}
		var row tracing.MeshRow
		require.NoError(t, json.Unmarshal(get("/api/v1/mesh/"+id), &row))
		require.Equal(t, creator.BeamID, row.Creator)
		require.Contains(t, string(get("/api/v1/mesh?creator="+creator.BeamID+"&limit=500")), id)
	})

	t.Run("SignedRequestThroughAnotherNode", func(t *testing.T) {
		// A signed request is verified (its nonce spent) by the node it
		// reaches, which forwards the agent it names; the same request
		// again, to that node or another, is refused.
		id := on(t, 0).create(creator.Identity, first.BeamID)
		on(t, 0).succeeded(creator.Identity, id)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodes[1].URL()+"/api/v1/mesh/"+id, nil)
		require.NoError(t, err)
		require.NoError(t, agents.SignMeshRequest(req, nil, creator.Identity, time.Now()))
		for i, node := range []int{1, 1, 2} {
			r := req.Clone(ctx)
			r.URL.Host = strings.TrimPrefix(nodes[node].URL(), "http://")
			resp, err := http.DefaultClient.Do(r)
			require.NoError(t, err)
			out, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			if i == 0 {
				require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
				require.Contains(t, string(out), id)
				continue
			}
			require.NotEqual(t, http.StatusOK, resp.StatusCode, "replay %d through node %d", i, node)
			require.Contains(t, string(out), "NONCE_REUSED")
		}
	})

	t.Run("EventStreamThroughAnotherNode", func(t *testing.T) {
		release := make(chan struct{})
		var started atomic.Bool
		slowID, slow := sdkAgent(t, ctx, nodes[1].URL(), "mesh-slow@"+clusterDomain)
		slow.HandleMesh(func(ctx context.Context, hop *agents.MeshHop) (any, error) {
			started.Store(true)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return hop.Envelope.Payload, nil
		})
		require.NoError(t, slow.Connect(ctx))
		id := on(t, 0).create(creator.Identity, slowID.BeamID, second.BeamID)
		require.Eventually(t, started.Load, 30*time.Second, 20*time.Millisecond, "the slow actor got its hop")

		req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodes[2].URL()+"/api/v1/mesh/"+id+"/events", nil)
		require.NoError(t, err)
		req.Header.Set("X-Api-Key", creator.APIKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		events := readMeshEvents(resp)

		// The current state comes while the envelope is still open.
		ev := <-events
		require.Equal(t, "status", ev.name)
		require.Equal(t, tracing.MeshRunning, ev.row.Status, ev.data)
		require.Equal(t, slowID.BeamID, ev.row.Actor)
		// The actor's processing report, sent to its own node (node 1),
		// reached the owner (node 0) and comes through node 2's stream.
		select {
		case ev = <-events:
			require.Equal(t, "progress", ev.name, ev.data)
			require.Positive(t, ev.progress())
		case <-time.After(20 * time.Second):
			t.Fatal("no progress event while the actor works")
		}
		close(release)
		// Then the next hop and the end, as they happen; the stream ends.
		var actors []string
		var last meshEvent
		for ev := range events {
			if ev.name == "status" {
				actors = append(actors, ev.row.Actor)
				last = ev
			}
		}
		require.Contains(t, actors, second.BeamID, "the second hop was streamed")
		require.Equal(t, tracing.MeshSucceeded, last.row.Status, last.data)
	})

	t.Run("PolicyOfActorOnAnotherNode", func(t *testing.T) {
		mallory := on(t, 0).agent("mesh-mallory@"+clusterDomain, false, nil)
		dan := on(t, 1).agent("mesh-dan@"+clusterDomain, false, nil)
		status, _, out := on(t, 1).call(dan.APIKey, http.MethodPost, "/acl",
			map[string]any{"targetBeamId": dan.BeamID, "intentType": "*", "allowedFrom": mallory.BeamID, "effect": "deny"})
		require.Equal(t, http.StatusCreated, status, string(out))
		// Mallory's envelope through node 0 to dan on node 1, as the first
		// actor and after a hop of her own.
		on(t, 0).forbidden(mallory.Identity, on(t, 0).create(mallory.Identity, dan.BeamID), "denied by acl rule")
		on(t, 0).forbidden(mallory.Identity, on(t, 0).create(mallory.Identity, mallory.BeamID, dan.BeamID), "denied by acl rule")
		require.Zero(t, dan.hops.count(), "dan received no hop")
		// An author dan allows still reaches him across nodes.
		on(t, 0).succeeded(creator.Identity, on(t, 0).create(creator.Identity, dan.BeamID))
		require.Equal(t, 1, dan.hops.count())
	})

	t.Run("ForgedHopHandOverRefused", func(t *testing.T) {
		// Attack: a NATS client with publish rights hands node 1 a hop for
		// an actor connected there, "authored" by the creator: unsealed,
		// sealed by another key, and sealed by the cluster's key for
		// another node (a captured hand-over sent elsewhere).
		nc := memberClient(t, nodes[0])
		token := cluster.Token(clusterDomain)
		env := map[string]any{"id": "forged-env", "route": map[string]any{"prev": []string{}, "curr": first.BeamID, "next": []string{}},
			"payload": map[string]any{"forged": true}, "creator": creator.BeamID, "headers": map[string]string{}}
		payload, err := json.Marshal(env)
		require.NoError(t, err)
		f := wire.NewIntentFrame(creator.BeamID, first.BeamID, wire.MeshIntent, payload, time.Now())
		f.Nonce = "mesh:forged-env"
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		h, err := json.Marshal(directory.HandOver{Frame: raw, Unsigned: true, TimeoutMs: 5000, FromNode: "node0",
			Hop: &directory.HopMark{Author: creator.BeamID, Auth: directory.BusAuthAPIKey, MessageID: "forged-env", Attempt: 1}})
		require.NoError(t, err)
		key, _, err := federation.LoadOrCreateKey(nodes[0].DataDir)
		require.NoError(t, err)
		misaddressed, err := wire.SignJWS("beam-cluster-handover+jws",
			mustJSON(t, map[string]any{"to": "node2", "exp": time.Now().Add(time.Minute).Unix(), "digest": sha256Hex(h)}), "node0", key)
		require.NoError(t, err)
		before := first.hops.count()
		for name, seal := range map[string]string{
			"unsealed":     "",
			"forged":       string(forgedJWS(t, "beam-cluster-handover+jws", mustJSON(t, map[string]any{"to": "node1", "exp": time.Now().Add(time.Minute).Unix(), "digest": sha256Hex(h)}))),
			"misaddressed": misaddressed,
		} {
			msg := nats.NewMsg("beam.cluster." + token + ".node.node1.intent")
			msg.Data = h
			if seal != "" {
				msg.Header.Set("Beam-Cluster-Seal", seal)
			}
			rep, err := nc.RequestMsg(msg, 20*time.Second)
			require.NoError(t, err, name)
			var hr directory.HandReply
			require.NoError(t, json.Unmarshal(rep.Data, &hr), name)
			require.NotNil(t, hr.Error, "%s hand-over taken: %s", name, rep.Data)
		}
		require.Equal(t, before, first.hops.count(), "the actor received a forged hop")
	})
}

// sha256Hex is the hex SHA-256 of b.
func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// meshEvent is one event of an envelope's SSE stream.
type meshEvent struct {
	name, data string
	row        tracing.MeshRow
}

// progress is the progress an event reports.
func (e meshEvent) progress() float64 {
	var p struct {
		Progress float64 `json:"progress"`
	}
	_ = json.Unmarshal([]byte(e.data), &p)
	return p.Progress
}

// readMeshEvents reads resp's SSE events until the stream ends.
func readMeshEvents(resp *http.Response) <-chan meshEvent {
	out := make(chan meshEvent, 64)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var ev meshEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data += strings.TrimPrefix(line, "data: ")
			case line == "" && ev.name != "":
				_ = json.Unmarshal([]byte(ev.data), &ev.row)
				out <- ev
				ev = meshEvent{}
			}
		}
	}()
	return out
}
