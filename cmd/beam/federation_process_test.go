package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
)

// requireFederationFlags skips when this build's beam serve has no
// federation flags yet.
func requireFederationFlags(t *testing.T) {
	t.Helper()
	out, _ := exec.Command(beamtest.Binary(t), "serve", "--help").CombinedOutput()
	if !strings.Contains(string(out), "-nats-listen") || !strings.Contains(string(out), "-peer") {
		t.Skip("beam serve has no --domain/--nats-listen/--peer flags in this build")
	}
}

// requirePeerCommand skips when `beam peer` is not in the command table yet.
func requirePeerCommand(t *testing.T) {
	t.Helper()
	out, _ := exec.Command(beamtest.Binary(t), "peer", "--help").CombinedOutput()
	if strings.Contains(string(out), "unknown command") {
		t.Skip("beam peer is not in the command table of this build")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func showSelf(t *testing.T, dataDir, domain, natsAddr string) string {
	t.Helper()
	out, err := beamtest.Run(t, context.Background(), "peer", "show-self", "--data-dir", dataDir, "--domain", domain, "--nats-listen", natsAddr)
	require.NoError(t, err, out)
	line := strings.TrimSpace(out)
	require.True(t, strings.HasPrefix(line, domain+"=nats://"+natsAddr+"#"), line)
	require.NotContains(t, line, "\n")
	// Stable: a second call prints the same line.
	again, err := beamtest.Run(t, context.Background(), "peer", "show-self", "--data-dir", dataDir, "--domain", domain, "--nats-listen", natsAddr)
	require.NoError(t, err)
	require.Equal(t, line, strings.TrimSpace(again))
	return line
}

func TestPeerShowSelf(t *testing.T) {
	requirePeerCommand(t)
	t.Parallel()
	dir := t.TempDir()
	showSelf(t, dir, "acme.beam.directory", "127.0.0.1:4222")
	out, err := beamtest.Run(t, context.Background(), "peer", "show-self", "--data-dir", dir, "--domain", "not a domain", "--nats-listen", "127.0.0.1:4222")
	require.Error(t, err, out)
}

// Two beam serve processes: the target directory is stopped, 100 intents
// are sent, the target comes back, and every intent is acked at the origin
// and delivered once to the agent.
func TestFederationProcessesPeerDown(t *testing.T) {
	requirePeerCommand(t)
	requireFederationFlags(t)
	t.Parallel()
	alphaDir, betaDir := t.TempDir(), t.TempDir()
	alphaNATS, betaNATS := freeAddr(t), freeAddr(t)
	alphaLine := showSelf(t, alphaDir, "alpha.beam.directory", alphaNATS)
	betaLine := showSelf(t, betaDir, "beta.beam.directory", betaNATS)
	common := []string{"--default-policy", "allow", "--http-timeout", "120s"}
	alpha := beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: append([]string{"--domain", "alpha.beam.directory",
		"--nats-listen", alphaNATS, "--peer", betaLine}, common...)})
	beta := beamtest.Start(t, beamtest.Options{DataDir: betaDir, Args: append([]string{"--domain", "beta.beam.directory",
		"--nats-listen", betaNATS, "--peer", alphaLine}, common...)})

	pub, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	reg, _ := json.Marshal(map[string]any{"beamId": "a@alpha.beam.directory", "displayName": "a", "publicKey": wire.EncodePublicKey(pub), "capabilities": []string{}})
	resp, err := http.Post(alpha.URL()+"/agents/register", "application/json", bytes.NewReader(reg))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	bID, err := agents.GenerateIdentity("b@beta.beam.directory")
	require.NoError(t, err)
	var mu sync.Mutex
	deliveries := map[string]int{}
	connectB := func(url string) *agents.Client {
		c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: bID})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		c.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
			mu.Lock()
			deliveries[in.Nonce]++
			mu.Unlock()
			return agents.Success(map[string]any{"ok": true})
		})
		_, err = c.Register(context.Background(), "b", nil)
		require.NoError(t, err)
		require.NoError(t, c.Connect(context.Background()))
		return c
	}
	b1 := connectB(beta.URL())
	bID.APIKey = b1.APIKey()

	beta.Stop()
	const n = 100
	nonces := make([]string, n)
	results := make(chan int, n)
	for i := range n {
		f := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
		require.NoError(t, wire.SignIntent(f, priv))
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		nonces[i] = f.Nonce
		go func() {
			resp, err := http.Post(alpha.URL()+"/intents/send", "application/json", bytes.NewReader(raw))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	beta.Restart()
	_ = b1.Close()
	connectB(beta.URL())
	for range n {
		select {
		case st := <-results:
			require.Equal(t, http.StatusOK, st)
		case <-time.After(150 * time.Second):
			t.Fatal("intents did not complete after the target returned")
		}
	}
	mu.Lock()
	require.Len(t, deliveries, n)
	for nonce, k := range deliveries {
		require.Equal(t, 1, k, nonce)
	}
	mu.Unlock()
}

// The show-self command itself, without the binary's command table.
func TestPeerShowSelfInProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	require.NoError(t, runPeer(context.Background(), []string{"show-self", "--data-dir", dir, "--domain", "acme.beam.directory", "--nats-listen", "127.0.0.1:4222"}, &out, &errOut))
	line := strings.TrimSpace(out.String())
	require.Regexp(t, `^acme\.beam\.directory=nats://127\.0\.0\.1:4222#[A-Za-z0-9_-]{43}$`, line)
	out.Reset()
	require.NoError(t, runPeer(context.Background(), []string{"show-self", "--data-dir", dir, "--domain", "acme.beam.directory", "--nats-listen", "127.0.0.1:4222"}, &out, &errOut))
	require.Equal(t, line, strings.TrimSpace(out.String()))
	require.ErrorIs(t, runPeer(context.Background(), []string{"show-self", "--data-dir", dir}, &out, &errOut), errUsage)
	require.Error(t, runPeer(context.Background(), []string{"add", "--admin-token", "x", "garbage"}, &out, &errOut))
}
