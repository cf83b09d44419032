package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestListenEchoPipelineKeepsThePayloadFlat runs a pipeline through three
// `beam listen --echo` agents: each hop answers with the payload (and its
// name in "echoedBy"), never the envelope it arrived in.
func TestListenEchoPipelineKeepsThePayloadFlat(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	r := newCLIRunner(t, p)
	client := r.agent("client", "client@pipe.beam.directory")
	actors := []string{"a@pipe.beam.directory", "b@pipe.beam.directory", "c@pipe.beam.directory"}
	for _, a := range actors {
		name := strings.SplitN(a, "@", 2)[0]
		file := r.agent(name, a)
		r.ok("approve", "--identity", client, a)
		listen := exec.CommandContext(r.ctx, beamtest.Binary(t), "listen", "--identity", file, "--echo")
		listen.Dir, listen.Env = r.dir, r.env
		require.NoError(t, listen.Start())
		t.Cleanup(func() { _ = listen.Process.Kill(); _ = listen.Wait() })
	}
	require.Eventually(t, func() bool {
		var h struct {
			Connected int `json:"connectedAgents"`
		}
		status, err := httpGetJSON(p.URL()+"/health", &h)
		return err == nil && status == 200 && h.Connected == len(actors)
	}, 30*time.Second, 20*time.Millisecond)

	out := r.ok("mesh", "create", "--identity", client, "--route", strings.Join(actors, ","), "--payload", `{"text":"Hello world"}`)
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(lastLine(out)), &created), out)
	var got struct {
		Status   string `json:"status"`
		Envelope struct {
			Payload json.RawMessage `json:"payload"`
		} `json:"envelope"`
	}
	require.Eventually(t, func() bool {
		out := r.ok("mesh", "get", "--identity", client, created.ID)
		require.NoError(t, json.Unmarshal([]byte(lastLine(out)), &got), out)
		return got.Status == "succeeded" || got.Status == "failed"
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, "succeeded", got.Status)
	require.JSONEq(t, `{"text":"Hello world","echoedBy":["a@pipe.beam.directory","b@pipe.beam.directory","c@pipe.beam.directory"]}`, string(got.Envelope.Payload))

	// The envelope's trace by the id mesh create printed, with or without
	// its mesh: prefix, from the data directory, the running server and the
	// gateway (as its creator): the same table each way.
	local := []string{"trace", "--data-dir", p.DataDir}
	remote := []string{"trace", "--url", p.URL(), "--data-dir", p.DataDir}
	r.requireSameTrace([]string{"nonce mesh:" + created.ID, "succeeded"},
		append(local, created.ID), append(remote, created.ID), append(local, "mesh:"+created.ID), append(remote, "mesh:"+created.ID),
		[]string{"mesh", "trace", "--identity", client, created.ID}, []string{"mesh", "trace", "--data-dir", p.DataDir, created.ID})
	// beam mesh takes the operator flags of every operator command; the old
	// --operator-token still works.
	tok, err := os.ReadFile(filepath.Join(p.DataDir, "admin.token"))
	require.NoError(t, err)
	for _, auth := range [][]string{{"--data-dir", p.DataDir}, {"--admin-token", strings.TrimSpace(string(tok))}, {"--operator-token", strings.TrimSpace(string(tok))}} {
		require.Contains(t, r.ok(append([]string{"mesh", "list"}, auth...)...), created.ID, auth)
	}
	r.requireSameTrace(nil, append(local, "--json", created.ID), []string{"mesh", "trace", "--json", "--identity", client, created.ID})
}
