package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing/legacy/legacytest"
)

// TestTwoTerminalWalkthrough runs the README's walk-through with real
// processes: a directory, an agent listening with --echo, and another agent
// sending to it and to the built-in echo.
func TestTwoTerminalWalkthrough(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := append(os.Environ(), "BEAM_URL="+p.URL())
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, beamtest.Binary(t), args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "beam %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}

	run("keygen", "--beam-id", "bob@acme.beam.directory", "--out", "bob.json")
	run("register", "--identity", "bob.json", "--name", "Bob")
	run("keygen", "--beam-id", "alice@acme.beam.directory", "--out", "alice.json")
	run("register", "--identity", "alice.json", "--name", "Alice")

	// bob registered first and owns the org acme: alice has no same-org
	// rights until bob approves her, and she cannot approve herself.
	pending := exec.CommandContext(ctx, beamtest.Binary(t), "send", "--identity", "alice.json", "bob@acme.beam.directory", "conversation.message", `{"message":"early"}`)
	pending.Dir, pending.Env = dir, env
	pendingOut, err := pending.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(pendingOut), "not an approved member")
	self := exec.CommandContext(ctx, beamtest.Binary(t), "approve", "--identity", "alice.json", "alice@acme.beam.directory")
	self.Dir, self.Env = dir, env
	selfOut, err := self.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(selfOut), "FORBIDDEN")
	run("approve", "--identity", "bob.json", "alice@acme.beam.directory")

	listen := exec.CommandContext(ctx, beamtest.Binary(t), "listen", "--identity", "bob.json", "--echo")
	listen.Dir, listen.Env = dir, env
	require.NoError(t, listen.Start())
	t.Cleanup(func() { _ = listen.Process.Kill(); _ = listen.Wait() })

	// bob's session is up once the directory says it is online.
	require.Eventually(t, func() bool {
		var a struct {
			Connected int `json:"connectedAgents"`
		}
		resp, err := httpGetJSON(p.URL()+"/health", &a)
		return err == nil && resp == 200 && a.Connected == 1
	}, 30*time.Second, 20*time.Millisecond)

	out := run("send", "--identity", "alice.json", "bob@acme.beam.directory", "conversation.message", `{"message":"hello bob"}`)
	var res struct {
		Success bool `json:"success"`
		Payload struct {
			Message string `json:"message"`
		} `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(lastLine(out)), &res), out)
	require.True(t, res.Success)
	require.Equal(t, "Echo: hello bob", res.Payload.Message)

	out = run("send", "--identity", "alice.json", "echo@beam.directory", "conversation.message", `{"message":"hi"}`)
	require.NoError(t, json.Unmarshal([]byte(lastLine(out)), &res), out)
	require.True(t, res.Success)
	require.Equal(t, "Echo: hi", res.Payload.Message)

	// A send the policy refuses fails with a non-zero exit.
	run("keygen", "--beam-id", "mallory@evil.beam.directory", "--out", "mallory.json")
	run("register", "--identity", "mallory.json", "--name", "Mallory")
	cmd := exec.CommandContext(ctx, beamtest.Binary(t), "send", "--identity", "mallory.json", "bob@acme.beam.directory", "conversation.message", `{"message":"let me in"}`)
	cmd.Dir, cmd.Env = dir, env
	failOut, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(failOut), "FORBIDDEN")
}

// TestImportLegacyDatabase imports a database built from the reference's
// documented schema with the CLI and checks the normalized result.
func TestImportLegacyDatabase(t *testing.T) {
	t.Parallel()
	src := legacytest.Build(t, filepath.Join(t.TempDir(), "legacy.db"), legacytest.Directory, legacytest.Bus)
	dataDir := t.TempDir()
	ctx := context.Background()

	out, err := beamtest.Run(t, ctx, "import", "--data-dir", dataDir, src)
	// The fixture holds malformed rows on purpose: they are reported, not
	// written, and the command says so with a non-zero exit.
	require.Error(t, err)
	require.Regexp(t, `imported \d+ intents and \d+ bus messages`, out)
	require.Contains(t, out, "rejected")

	want, broken := legacytest.Expected(legacytest.Directory, legacytest.Bus)
	require.NotEmpty(t, broken)
	lg := openLog(t, dataDir)
	for nonce, w := range want {
		row, ok, err := lg.Intent(ctx, nonce)
		require.NoError(t, err)
		require.True(t, ok, "nonce %s not imported", nonce)
		require.Equal(t, w.Final(), row.Status, "nonce %s", nonce)
	}
	for nonce := range broken {
		_, ok, err := lg.Intent(ctx, nonce)
		require.NoError(t, err)
		require.False(t, ok, "malformed legacy nonce %s was written", nonce)
	}
	seq := lg.LastSeq()
	require.NoError(t, lg.Close())

	// Importing again writes nothing new.
	out, _ = beamtest.Run(t, ctx, "import", "--data-dir", dataDir, src)
	require.Contains(t, out, "imported 0 intents and 0 bus messages")
	lg = openLog(t, dataDir)
	require.Equal(t, seq, lg.LastSeq())
	st, ok, err := lg.State(ctx, firstKey(want))
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, st.Valid())
}

func firstKey[V any](m map[string]V) string {
	for k := range m {
		return k
	}
	return ""
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
