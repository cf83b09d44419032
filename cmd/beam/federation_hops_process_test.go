package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// traceEvents runs beam trace --json on a data directory (alongside its
// running server) and returns the events of nonce.
func traceEvents(t *testing.T, ctx context.Context, dataDir, nonce string) []tracing.Event {
	t.Helper()
	out, err := beamtest.Run(t, ctx, "trace", "--json", "--data-dir", dataDir, nonce)
	require.NoError(t, err, out)
	var events []tracing.Event
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("{")) {
			continue // the "reading the log in …" line
		}
		var ev tracing.Event
		require.NoError(t, json.Unmarshal(line, &ev), string(line))
		events = append(events, ev)
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, events, out)
	return events
}

// lastEventOf is the last event of trace in state st.
func lastEventOf(t *testing.T, trace []tracing.Event, st tracing.State) tracing.Event {
	t.Helper()
	for i := len(trace) - 1; i >= 0; i-- {
		if trace[i].State == st {
			return trace[i]
		}
	}
	require.FailNow(t, "no event in the trace", "state %s", st)
	return tracing.Event{}
}

// getJSON GETs url (with the bearer token unless it is empty), requires
// 200 and decodes the body into v.
func getJSON(t *testing.T, url, bearer string, v any) {
	t.Helper()
	status, _, body := do(t, http.MethodGet, url, bearer, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.NoError(t, json.Unmarshal(body, v), string(body))
}

// lookupKey fetches beamID's public key with GET /agents/{beamId} at
// baseURL.
func lookupKey(t *testing.T, baseURL, beamID string) ed25519.PublicKey {
	t.Helper()
	var doc struct {
		BeamID    string `json:"beamId"`
		PublicKey string `json:"publicKey"`
	}
	getJSON(t, baseURL+"/agents/"+beamID, "", &doc)
	require.Equal(t, beamID, doc.BeamID)
	pub, err := wire.ParsePublicKey(doc.PublicKey)
	require.NoError(t, err)
	return pub
}

// TestBeam2AcrossFederationProcesses: two beam serve processes peered over
// their embedded NATS servers. A beam/2 intent posted at alpha as the
// sender's compact JWS (application/jose) reaches a beam/2 agent of beta
// with that JWS verbatim; the agent's result JWS comes back to the sender
// intact and verifies against the agent's key as alpha's GET /agents/{id}
// returns it. The Go SDK in beam/2 mode gets the same. beam trace shows the
// tokens in both directories' logs; a JWS signed with another key is
// refused at alpha and never delivered.
func TestBeam2AcrossFederationProcesses(t *testing.T) {
	t.Parallel()
	common := []string{"--default-policy", "allow", "--http-timeout", "30s"}
	fp := startFedPair(t, true, common, common)
	alpha, beta := fp.alpha, fp.beta
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	bID, err := agents.GenerateIdentity("b@beta.beam.directory")
	require.NoError(t, err)
	b, err := agents.NewClient(agents.ClientConfig{DirectoryURL: beta.URL(), Identity: bID, Protocol: agents.ProtocolBeam2,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	_, err = b.Register(ctx, "b", nil)
	require.NoError(t, err)
	got := make(chan *agents.Intent, 4)
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Success(map[string]any{"heard": in.Nonce})
	})
	require.NoError(t, b.Connect(ctx))

	aPub, aPriv, err := wire.GenerateKey()
	require.NoError(t, err)
	reg, err := json.Marshal(map[string]any{"beamId": "a@alpha.beam.directory", "displayName": "a",
		"publicKey": wire.EncodePublicKey(aPub), "capabilities": []string{}})
	require.NoError(t, err)
	resp, err := http.Post(alpha.URL()+"/agents/register", "application/json", bytes.NewReader(reg))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	send := func(token string) (int, http.Header, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, alpha.URL()+"/intents/send", strings.NewReader(token))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/jose")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(body)
	}

	f := wire.NewIntentFrame("a@alpha.beam.directory", bID.BeamID, "task", json.RawMessage(`{"n":1}`), time.Now())
	token, err := wire.SignIntentJWS(f, aPriv)
	require.NoError(t, err)
	status, hdr, body := send(token)
	require.Equal(t, http.StatusOK, status, body)
	var in *agents.Intent
	select {
	case in = <-got:
	case <-ctx.Done():
		t.Fatal("the intent never reached b")
	}
	require.Equal(t, f.Nonce, in.Nonce)
	require.Equal(t, token, in.JWS, "the recipient gets the sender's JWS verbatim")
	require.Nil(t, in.Attested, "a JWS is the sender's own signature, not an attestation")

	resultJWS := hdr.Get(wire.HeaderResultJWS)
	require.NotEmpty(t, resultJWS, "the result JWS comes back to the sender")
	bKey := lookupKey(t, alpha.URL(), bID.BeamID)
	require.Equal(t, bID.Public, bKey, "alpha serves the peer agent's key")
	rf, _, err := wire.DecodeResultJWS(resultJWS, func(kid string) (ed25519.PublicKey, error) {
		require.Equal(t, bID.BeamID, kid)
		return bKey, nil
	})
	require.NoError(t, err, "the result JWS verifies with the key alpha serves for b")
	require.True(t, rf.Success)
	require.Equal(t, f.Nonce, rf.Nonce)
	require.JSONEq(t, body, string(rf.Raw))
	require.JSONEq(t, `{"heard":"`+f.Nonce+`"}`, string(rf.Payload))

	// Both logs hold the tokens; beam trace reads them next to the servers.
	btr := traceEvents(t, ctx, beta.DataDir, f.Nonce)
	require.Equal(t, token, btr[0].Details.Extra["jws"])
	require.Equal(t, "beam/2", btr[0].Details.Extra["protocol"])
	require.Equal(t, resultJWS, lastEventOf(t, btr, tracing.Acked).Details.Extra["resultJWS"])
	atr := traceEvents(t, ctx, alpha.DataDir, f.Nonce)
	require.Equal(t, token, atr[0].Details.Extra["jws"])
	require.Equal(t, resultJWS, lastEventOf(t, atr, tracing.Acked).Details.Extra["resultJWS"])

	// The Go SDK speaking beam/2 at alpha: it verifies the result JWS
	// against the key its own directory returns for the peer's agent.
	sID, err := agents.GenerateIdentity("s@alpha.beam.directory")
	require.NoError(t, err)
	s2, err := agents.NewClient(agents.ClientConfig{DirectoryURL: alpha.URL(), Identity: sID, Protocol: agents.ProtocolBeam2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Close() })
	_, err = s2.Register(ctx, "s", nil)
	require.NoError(t, err)
	sres, err := s2.Send(ctx, bID.BeamID, "task", map[string]any{"n": 2})
	require.NoError(t, err)
	require.True(t, sres.Success)
	select {
	case in = <-got:
	case <-ctx.Done():
		t.Fatal("the SDK's intent never reached b")
	}
	require.NotEmpty(t, in.JWS)
	require.Equal(t, sres.Nonce, in.Nonce)

	// A JWS signed with another key than a's is refused at alpha.
	_, rogue, err := wire.GenerateKey()
	require.NoError(t, err)
	forged := wire.NewIntentFrame("a@alpha.beam.directory", bID.BeamID, "task", json.RawMessage(`{}`), time.Now())
	bad, err := wire.SignIntentJWS(forged, rogue)
	require.NoError(t, err)
	status, _, body = send(bad)
	require.NotEqual(t, http.StatusOK, status, body)
	require.Contains(t, body, "JWS verification failed")
	out, err := beamtest.Run(t, ctx, "trace", "--data-dir", beta.DataDir, forged.Nonce)
	require.Error(t, err, "beta never heard of the forged intent: %s", out)
	require.Contains(t, out, "no events for nonce")
	select {
	case in := <-got:
		t.Fatalf("a forged JWS reached b: %s", in.Nonce)
	default:
	}
}

// observedNonces lists the nonces of the intents a running directory's
// dashboard API (GET /observability/intents, operator token) shows.
func observedNonces(t *testing.T, p *beamtest.Process) []string {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(p.DataDir, "admin.token"))
	require.NoError(t, err)
	var list struct {
		Intents []struct {
			Nonce string `json:"nonce"`
		} `json:"intents"`
	}
	getJSON(t, p.URL()+"/observability/intents", strings.TrimSpace(string(token)), &list)
	nonces := []string{}
	for _, in := range list.Intents {
		nonces = append(nonces, in.Nonce)
	}
	return nonces
}

// TestNoForwardingThroughIntermediateDirectoryProcesses: three beam serve
// processes where alpha peers with beta and beta with gamma, but alpha not
// with gamma. beta reaches gamma's agent; from alpha, sync and durable sends
// to it (Go SDK, bus API with an API key, beam send) are refused with
// UNKNOWN_AGENT saying that federation does not forward through an
// intermediate directory and that gamma's directory must be pinned, and
// nothing of them reaches beta or gamma.
func TestNoForwardingThroughIntermediateDirectoryProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type dir struct{ data, nats, line string }
	dirs := map[string]*dir{}
	for _, name := range []string{"alpha", "beta", "gamma"} {
		d := &dir{data: t.TempDir(), nats: freeAddr(t)}
		d.line = showSelf(t, d.data, name+".beam.directory", d.nats)
		dirs[name] = d
	}
	start := func(name string, peers ...string) *beamtest.Process {
		args := []string{"--domain", name + ".beam.directory", "--nats-listen", dirs[name].nats, "--default-policy", "allow", "--http-timeout", "30s"}
		for _, p := range peers {
			args = append(args, "--peer", dirs[p].line)
		}
		return beamtest.Start(t, beamtest.Options{DataDir: dirs[name].data, Args: args})
	}
	alpha := start("alpha", "beta")
	beta := start("beta", "alpha", "gamma")
	gamma := start("gamma", "beta")

	_, c := sdkAgent(t, ctx, gamma.URL(), "c@gamma.beam.directory")
	got := make(chan string, 16)
	c.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in.From
		return agents.Success(map[string]any{"ok": true})
	})
	require.NoError(t, c.Connect(ctx))

	// beta, which peers with gamma, reaches c: the path exists one hop on.
	_, b := sdkAgent(t, ctx, beta.URL(), "b@beta.beam.directory")
	res, err := b.Send(ctx, "c@gamma.beam.directory", "task.run", map[string]any{"n": 0})
	require.NoError(t, err)
	require.True(t, res.Success)
	require.Equal(t, "b@beta.beam.directory", <-got)
	control := res.Nonce

	aID, a := sdkAgent(t, ctx, alpha.URL(), "a@alpha.beam.directory")
	_, err = a.Send(ctx, "c@gamma.beam.directory", "task.run", map[string]any{"n": 1})
	require.ErrorContains(t, err, "UNKNOWN_AGENT")
	require.ErrorContains(t, err, "does not forward through intermediate directories: pin its directory as a peer")
	_, err = a.SendDurable(ctx, "c@gamma.beam.directory", "task.run", map[string]any{"n": 2}, nil)
	require.ErrorContains(t, err, "UNKNOWN_AGENT")
	require.ErrorContains(t, err, "pin its directory as a peer")
	status, body := busPost(t, ctx, alpha.URL(), map[string]any{"from": aID.BeamID, "to": "c@gamma.beam.directory",
		"intent": "task.run", "payload": map[string]any{"n": 3}}, "x-api-key", aID.APIKey)
	require.Equal(t, http.StatusNotFound, status, "%v", body)
	require.Equal(t, "UNKNOWN_AGENT", body["errorCode"])
	require.Contains(t, body["error"], "pin its directory as a peer")

	// What a user of the CLI sees.
	r := newCLIRunner(t, alpha)
	file := r.agent("a2", "a2@alpha.beam.directory")
	out := r.fail("send", "--identity", file, "c@gamma.beam.directory", "task.run", `{"n":4}`)
	require.Contains(t, out, "UNKNOWN_AGENT")
	require.Contains(t, out, "does not forward through intermediate directories: pin its directory as a peer")
	out = r.fail("send", "--identity", file, "c@gamma.beam.directory", "task.run", `{"n":5}`, "--durable")
	require.Contains(t, out, "UNKNOWN_AGENT")
	require.Contains(t, out, "pin its directory as a peer")

	// Nothing reached beta or gamma: their logs hold only the control
	// intent, and c heard nothing more.
	require.Equal(t, []string{control}, observedNonces(t, gamma))
	require.Equal(t, []string{control}, observedNonces(t, beta))
	select {
	case from := <-got:
		t.Fatalf("c got an intent from %s", from)
	default:
	}
}
