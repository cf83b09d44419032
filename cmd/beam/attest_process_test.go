package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
)

// Process tests of attested delivery: a real `beam serve`, agents built on
// the published beam-protocol-sdk 0.5.1 running in Node
// (fixtures/interop-js/agent.mjs), and senders using an API key, the
// operator bus key or their own signature.

// jsAgent is a running fixtures/interop-js/agent.mjs.
type jsAgent struct {
	t      *testing.T
	beamID string
	stdin  io.WriteCloser
	events chan jsEvent
	early  []jsEvent // "handled" lines read while waiting for "connected"
}

// jsEvent is one line the agent printed.
type jsEvent struct {
	Event   string          `json:"event"`
	BeamID  string          `json:"beamId"`
	Nonce   string          `json:"nonce"`
	From    string          `json:"from"`
	Intent  string          `json:"intent"`
	Payload json.RawMessage `json:"payload"`
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Message string          `json:"message"`
}

// startJSAgent registers name@org.beam.directory with SDK 0.5.1 in a Node
// process. It skips the test when Node or the SDK is not installed.
// env holds extra KEY=VALUE entries (BEAM_INTENTS).
func startJSAgent(t *testing.T, ctx context.Context, baseURL, name, org string, env ...string) *jsAgent {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH; the beam-protocol-sdk 0.5.1 process tests need Node.js 18+")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "fixtures", "interop-js"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "beam-protocol-sdk")); err != nil {
		t.Skipf("%s/node_modules is missing; run `npm ci` there first", dir)
	}
	cmd := exec.CommandContext(ctx, node, "agent.mjs")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "BEAM_URL="+baseURL, "BEAM_AGENT="+name, "BEAM_ORG="+org), env...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	a := &jsAgent{t: t, stdin: stdin, events: make(chan jsEvent, 64)}
	go func() {
		defer close(a.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev jsEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				a.events <- ev
			}
		}
	}()
	t.Cleanup(func() {
		_, _ = io.WriteString(stdin, "quit\n")
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, stderr.String())
		}
	})
	ev := a.next("registered")
	a.beamID = ev.BeamID
	return a
}

// next returns the next event, which must be of kind.
func (a *jsAgent) next(kind string) jsEvent {
	a.t.Helper()
	ev := a.nextAny(kind)
	require.Equal(a.t, kind, ev.Event, "agent printed %+v", ev)
	return ev
}

// nextAny returns the next event; want says what the caller waits for.
func (a *jsAgent) nextAny(want string) jsEvent {
	a.t.Helper()
	select {
	case ev, ok := <-a.events:
		require.True(a.t, ok, "agent process exited while waiting for %q", want)
		return ev
	case <-time.After(30 * time.Second):
		require.FailNow(a.t, "no event from the agent within 30s", "waiting for %q", want)
		return jsEvent{}
	}
}

// connected waits for the agent's "connected" line. An intent queued for
// the agent can reach its handler before its connect() call returns (the
// directory writes it right behind the connected message, and the SDK runs
// the handler for both frames of one read before the call's continuation),
// so "handled" lines before it are kept for handledNonces.
func (a *jsAgent) connected() {
	a.t.Helper()
	for {
		ev := a.nextAny("connected")
		switch ev.Event {
		case "connected":
			return
		case "handled":
			a.early = append(a.early, ev)
		default:
			require.FailNow(a.t, "unexpected event while connecting", "agent printed %+v", ev)
		}
	}
}

// command writes one command line to the agent.
func (a *jsAgent) command(cmd string) {
	a.t.Helper()
	_, err := io.WriteString(a.stdin, cmd+"\n")
	require.NoError(a.t, err)
}

// handledNonces waits for n handled events and returns their nonces.
func (a *jsAgent) handledNonces(n int) map[string]jsEvent {
	a.t.Helper()
	out := map[string]jsEvent{}
	for len(out) < n {
		var ev jsEvent
		if len(a.early) > 0 {
			ev, a.early = a.early[0], a.early[1:]
		} else {
			ev = a.next("handled")
		}
		out[ev.Nonce] = ev
	}
	return out
}

// busPost posts body to /v1/beam/send with one credential header and
// returns the status and decoded answer.
func busPost(t *testing.T, ctx context.Context, baseURL string, body any, header, value string) (int, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/beam/send", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if header != "" {
		req.Header.Set(header, value)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// busMessage is GET /v1/beam/messages/{id} as the sender sees it.
type busMessage struct {
	Status   string          `json:"status"`
	Response json.RawMessage `json:"response"`
	Error    *string         `json:"error"`
}

// getMessage reads message id with the sender's API key.
func getMessage(t *testing.T, ctx context.Context, baseURL, apiKey, id string) busMessage {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/v1/beam/messages/"+id, nil)
	require.NoError(t, err)
	req.Header.Set("x-api-key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var m busMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	return m
}

// waitAcked waits until message id is acked and returns it; a message
// that ends any other way fails the test.
func waitAcked(t *testing.T, ctx context.Context, baseURL, apiKey, id string) busMessage {
	t.Helper()
	var m busMessage
	require.Eventually(t, func() bool {
		m = getMessage(t, ctx, baseURL, apiKey, id)
		require.NotContains(t, []string{"failed", "dead_letter"}, m.Status, "message %s ended %s: %v", id, m.Status, m.Error)
		return m.Status == "acked"
	}, 30*time.Second, 20*time.Millisecond, "message %s was never acked", id)
	return m
}

func randomSuffix(t *testing.T) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// TestSDK051AgentGetsAttestedDurableSends: API-key and bus-key durable
// sends to a beam-protocol-sdk 0.5.1 agent — sent while it is offline, then
// while it is online — run its handler and end acked with its result. A
// message the agent drops (it has no handler for the intent) is not taken
// for a success: the attempt is recorded as unanswered.
func TestSDK051AgentGetsAttestedDurableSends(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: append([]string{"--allow-legacy-ws-identity"}, busArgs...)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sfx := randomSuffix(t)
	sender, _ := sdkAgent(t, ctx, p.URL(), "sender-"+sfx+"@interop.beam.directory")
	worker := startJSAgent(t, ctx, p.URL(), "worker-"+sfx, "interop", "BEAM_INTENTS=job.run")

	sends := []struct{ header, value string }{
		{"x-api-key", sender.APIKey},
		{"Authorization", "Bearer test-bus-key"},
	}
	type sent struct{ id, nonce string }
	sendAll := func(n int, wantStatus ...string) []sent {
		var out []sent
		for i, s := range sends {
			status, body := busPost(t, ctx, p.URL(), map[string]any{
				"from": sender.BeamID, "to": worker.beamID, "intent": "job.run",
				// The attested signature must match what JavaScript re-serialises.
				"payload": map[string]any{"n": n + i, "text": jsText, "f": 1.5e-7},
			}, s.header, s.value)
			require.Equal(t, http.StatusCreated, status, "%v", body)
			require.Contains(t, wantStatus, body["status"], "%v", body)
			out = append(out, sent{id: body["message_id"].(string), nonce: body["nonce"].(string)})
		}
		return out
	}
	check := func(msgs []sent, n int) {
		handled := worker.handledNonces(len(msgs))
		for i, m := range msgs {
			ev, ok := handled[m.nonce]
			require.True(t, ok, "the 0.5.1 handler ran for %s", m.nonce)
			require.Equal(t, sender.BeamID, ev.From)
			require.Equal(t, "job.run", ev.Intent)
			var pl struct {
				Text string `json:"text"`
			}
			require.NoError(t, json.Unmarshal(ev.Payload, &pl))
			require.Equal(t, jsText, pl.Text)
			got := waitAcked(t, ctx, p.URL(), sender.APIKey, m.id)
			require.JSONEq(t, `{"heard":"job.run","n":`+jsonInt(n+i)+`}`, string(got.Response))
		}
	}

	// Offline: accepted and queued; delivered when the agent connects.
	offline := sendAll(1, "queued")
	worker.command("connect")
	worker.connected()
	check(offline, 1)

	// Online: delivered at once.
	online := sendAll(10, "delivered", "acked")
	check(online, 10)

	// SDK 0.5.1 drops an intent it has no handler for without a word: the
	// frame was handed to its session (delivered), and the attempt ends
	// saying the recipient did not answer, not that it succeeded.
	status, body := busPost(t, ctx, p.URL(), map[string]any{
		"from": sender.BeamID, "to": worker.beamID, "intent": "job.unknown",
	}, "x-api-key", sender.APIKey)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	require.Contains(t, []any{"dispatched", "delivered"}, body["status"], "%v", body)
	var m busMessage
	require.Eventually(t, func() bool {
		m = getMessage(t, ctx, p.URL(), sender.APIKey, body["message_id"].(string))
		return m.Error != nil
	}, 30*time.Second, 20*time.Millisecond)
	require.NotEqual(t, "acked", m.Status)
	require.Contains(t, *m.Error, "did not answer attempt 1")
	require.Contains(t, *m.Error, "beam/1 session")
	require.Contains(t, *m.Error, "may have rejected the frame")

	// The key that signed them is the one the directory publishes, and it
	// is kept in the data directory across restarts.
	doc := attestationDoc(t, p.URL())
	p.Restart()
	require.Equal(t, doc.Keys, attestationDoc(t, p.URL()).Keys)
}

// TestSDK051AgentRequiringSenderSignatures: an SDK 0.5.1 agent turns on
// requireSenderSignatures with a signed config change; API-key and bus-key
// sends to it are refused at send time, naming the setting, and a
// sender-signed frame reaches its handler and ends acked.
func TestSDK051AgentRequiringSenderSignatures(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: append([]string{"--allow-legacy-ws-identity"}, busArgs...)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sfx := randomSuffix(t)
	sender, _ := sdkAgent(t, ctx, p.URL(), "sender-"+sfx+"@interop.beam.directory")
	strict := startJSAgent(t, ctx, p.URL(), "strict-"+sfx, "interop")
	strict.command("connect")
	strict.next("connected")
	strict.command("require-signatures")
	ev := strict.next("setting")
	require.Equal(t, http.StatusOK, ev.Status, "%s", ev.Body)
	require.Contains(t, string(ev.Body), `"requireSenderSignatures":true`)

	for _, s := range []struct{ header, value string }{
		{"x-api-key", sender.APIKey},
		{"Authorization", "Bearer test-bus-key"},
	} {
		status, body := busPost(t, ctx, p.URL(), map[string]any{
			"from": sender.BeamID, "to": strict.beamID, "intent": "job.run", "payload": map[string]any{"n": 1},
		}, s.header, s.value)
		require.Equal(t, http.StatusForbidden, status, "%v", body)
		require.Equal(t, "SENDER_SIGNATURE_REQUIRED", body["errorCode"])
		require.Contains(t, body["error"], "requireSenderSignatures")
	}

	f := wire.NewIntentFrame(sender.BeamID, strict.beamID, "job.run", json.RawMessage(`{"n":7}`), time.Now())
	require.NoError(t, wire.SignIntent(f, sender.Private))
	frame, err := f.DeliveryJSON()
	require.NoError(t, err)
	status, body := busPost(t, ctx, p.URL(), map[string]any{"frame": json.RawMessage(frame)}, "", "")
	require.Equal(t, http.StatusCreated, status, "%v", body)
	handled := strict.next("handled")
	require.Equal(t, f.Nonce, handled.Nonce, "only the sender-signed message reaches the handler")
	got := waitAcked(t, ctx, p.URL(), sender.APIKey, body["message_id"].(string))
	require.JSONEq(t, `{"heard":"job.run","n":7}`, string(got.Response))
}

// jsText is a payload string whose escaping differs between Go's
// encoding/json and JavaScript's JSON.stringify.
const jsText = "grüße <&> \u2028 \"q\" \\ \t"

func jsonInt(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// attestationDoc reads the directory's published attestation keys.
func attestationDoc(t *testing.T, baseURL string) *wire.AttestationKeys {
	t.Helper()
	resp, err := http.Get(baseURL + wire.AttestationKeysPath)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	doc, _, err := wire.DecodeAttestationKeys(b)
	require.NoError(t, err)
	return doc
}
