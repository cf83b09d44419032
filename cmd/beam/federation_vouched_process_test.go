package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// TestFederationVouchedDurableProcesses: two beam serve processes, over
// their embedded NATS servers and through a shared external NATS
// (--nats-url). An API-key durable send to a peer's agent while the peer is
// down is acked after it returns and delivered once, attested by the peer
// and vouched for by the origin; a send to a peer's agent that requires
// end-to-end sender signatures ends failed with SENDER_SIGNATURE_REQUIRED,
// recorded in both directories' traces, and never reaches the agent.
func TestFederationVouchedDurableProcesses(t *testing.T) {
	t.Parallel()
	for _, topology := range []string{"embedded", "nats-url"} {
		t.Run(topology, func(t *testing.T) {
			t.Parallel()
			alphaDir, betaDir := t.TempDir(), t.TempDir()
			var alphaArgs, betaArgs []string
			if topology == "embedded" {
				alphaNATS, betaNATS := freeAddr(t), freeAddr(t)
				alphaLine := showSelf(t, alphaDir, "alpha.beam.directory", alphaNATS)
				betaLine := showSelf(t, betaDir, "beta.beam.directory", betaNATS)
				alphaArgs = []string{"--nats-listen", alphaNATS, "--peer", betaLine}
				betaArgs = []string{"--nats-listen", betaNATS, "--peer", alphaLine}
			} else {
				url, alphaLine, betaLine := sharedNATS(t, alphaDir, betaDir)
				alphaArgs = []string{"--nats-url", url, "--peer", betaLine}
				betaArgs = []string{"--nats-url", url, "--peer", alphaLine}
			}
			runVouchedDurable(t, alphaDir, betaDir, alphaArgs, betaArgs)
		})
	}
}

func runVouchedDurable(t *testing.T, alphaDir, betaDir string, alphaArgs, betaArgs []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	common := []string{"--default-policy", "allow", "--bus-tick-interval", "100ms", "--bus-delivery-timeout", "30s"}
	alpha := beamtest.Start(t, beamtest.Options{DataDir: alphaDir,
		Args: append(append([]string{"--domain", "alpha.beam.directory"}, alphaArgs...), common...)})
	beta := beamtest.Start(t, beamtest.Options{DataDir: betaDir,
		Args: append(append([]string{"--domain", "beta.beam.directory"}, betaArgs...), common...)})

	aID, _ := sdkAgent(t, ctx, alpha.URL(), "a@alpha.beam.directory")
	bID, b1 := sdkAgent(t, ctx, beta.URL(), "b@beta.beam.directory")
	counter := &deliveryCounter{seen: map[string]int{}, attested: map[string]string{}, held: make(chan struct{}, 1)}
	b1.Handle("*", counter.handle)
	require.NoError(t, b1.Connect(ctx))
	sID, strict := sdkAgent(t, ctx, beta.URL(), "strict@beta.beam.directory")
	strict.Handle("*", counter.handle)
	require.NoError(t, strict.Connect(ctx))
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, beta.URL()+"/agents/"+sID.BeamID+"/config",
		strings.NewReader(`{"requireSenderSignatures":true}`))
	require.NoError(t, err)
	req.Header.Set("x-api-key", sID.APIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The peer is down while the API-key send is accepted.
	beta.Stop()
	_ = b1.Close()
	_ = strict.Close()
	status, body := busPost(t, ctx, alpha.URL(), map[string]any{"from": aID.BeamID, "to": bID.BeamID,
		"intent": "task.run", "payload": map[string]any{"n": 1}}, "x-api-key", aID.APIKey)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	id, nonce := body["message_id"].(string), body["nonce"].(string)
	require.Equal(t, "dispatched", getMessage(t, ctx, alpha.URL(), aID.APIKey, id).Status, "waits in the outbox")

	beta.Restart()
	b2 := sdkClient(t, beta.URL(), bID)
	b2.Handle("*", counter.handle)
	require.NoError(t, b2.Connect(ctx))
	waitAcked(t, ctx, alpha.URL(), aID.APIKey, id)
	counter.requireOnce(t, []string{nonce})
	counter.mu.Lock()
	require.Equal(t, wire.AttestPeer+" by beta.beam.directory, vouched by alpha.beam.directory", counter.attested[nonce])
	counter.mu.Unlock()

	// The operator sees the row in the CLI; a replay of an acked intent's
	// row is refused with the reason.
	out, err := beamtest.Run(t, ctx, "peer", "outbox", "--url", alpha.URL(), "--data-dir", alphaDir, "--state", "PUBLISHED")
	require.NoError(t, err, out)
	require.Contains(t, out, nonce)
	var rowID string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, nonce) {
			rowID = strings.Fields(line)[0]
		}
	}
	out, err = beamtest.Run(t, ctx, "peer", "replay", "--url", alpha.URL(), "--data-dir", alphaDir, rowID)
	require.Error(t, err, out)
	require.Contains(t, out, "INTENT_FINISHED")
	require.Contains(t, out, "already acked")

	// The strict agent refuses a vouched message; the origin hears why.
	s2 := sdkClient(t, beta.URL(), sID)
	s2.Handle("*", counter.handle)
	require.NoError(t, s2.Connect(ctx))
	status, body = busPost(t, ctx, alpha.URL(), map[string]any{"from": aID.BeamID, "to": sID.BeamID,
		"intent": "task.run"}, "x-api-key", aID.APIKey)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	strictID, strictNonce := body["message_id"].(string), body["nonce"].(string)
	var m busMessage
	require.Eventually(t, func() bool {
		m = getMessage(t, ctx, alpha.URL(), aID.APIKey, strictID)
		return m.Status == "failed"
	}, time.Minute, 50*time.Millisecond, "the refusal is the message's outcome")
	require.NotNil(t, m.Error)
	require.Contains(t, *m.Error, "requireSenderSignatures")

	alpha.Stop()
	beta.Stop()
	counter.mu.Lock()
	require.NotContains(t, counter.seen, strictNonce, "the strict agent never sees an attested message")
	counter.mu.Unlock()
	logs := map[string]*tracing.Log{} // one writer per log: each is opened once
	logOf := func(dir string) *tracing.Log {
		if logs[dir] == nil {
			logs[dir] = openLog(t, dir)
		}
		return logs[dir]
	}
	for _, side := range []struct {
		dir    string
		states []tracing.State
	}{
		// alpha's dispatched annotations (the outbox's steps) are folded.
		{alphaDir, []tracing.State{tracing.Received, tracing.Dispatched, tracing.Failed}},
		{betaDir, []tracing.State{tracing.Received, tracing.Failed}},
	} {
		tr, err := logOf(side.dir).Trace(ctx, strictNonce)
		require.NoError(t, err)
		var got []tracing.State
		for _, ev := range tr {
			if len(got) == 0 || got[len(got)-1] != ev.State {
				got = append(got, ev.State)
			}
		}
		require.Equal(t, side.states, got, side.dir)
		last := tr[len(tr)-1]
		require.Equal(t, directory.CodeSenderSignatureRequired, last.Details.ErrorCode, side.dir)
		require.Contains(t, last.Details.Error, "requireSenderSignatures", side.dir)
	}
	// beam trace on the sending side shows where the message waited.
	out, err = beamtest.Run(t, ctx, "trace", "--data-dir", alphaDir, nonce)
	require.NoError(t, err, out)
	for _, want := range []string{`"state":"PENDING"`, `"state":"CLAIMED"`, `"state":"PUBLISHED"`, `"lastError":`, "beta.beam.directory"} {
		require.Contains(t, out, want)
	}
	btr, err := logOf(betaDir).Trace(ctx, nonce)
	require.NoError(t, err)
	require.Equal(t, "alpha.beam.directory", btr[0].Details.Extra["vouchedBy"])
	require.Equal(t, wire.AttestAPIKey, btr[0].Details.Extra["vouchedAuth"])
}
