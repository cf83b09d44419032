package federation

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// busSend posts body to /v1/beam/send with one credential header.
func busSend(t *testing.T, ctx context.Context, url, header, value, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/beam/send", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(header, value)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data)
}

type sendReceipt struct {
	MessageID string `json:"message_id"`
	Nonce     string `json:"nonce"`
	Status    string `json:"status"`
}

func decodeSend(t *testing.T, body string) sendReceipt {
	t.Helper()
	var r sendReceipt
	require.NoError(t, json.Unmarshal([]byte(body), &r), body)
	require.NotEmpty(t, r.Nonce, body)
	return r
}

// requestReply sends tok on subj as origin (nc is origin's connection to
// the target) and opens the target's signed reply.
func requestReply(t *testing.T, nc *nats.Conn, subj string, tok []byte, origin *fedDir) *Message {
	t.Helper()
	msg, err := nc.Request(subj, tok, 10*time.Second)
	require.NoError(t, err)
	target, _, _, err := parseSubject(subj)
	require.NoError(t, err)
	m, err := open(msg.Data, origin.domain, strings.ReplaceAll(target, "_", "."), kindResult, origin.node.pinnedKey, time.Now())
	require.NoError(t, err)
	return m
}

// eventOf returns the last event of tr in state st.
func eventOf(t *testing.T, tr []tracing.Event, st tracing.State) tracing.Event {
	t.Helper()
	for i := len(tr) - 1; i >= 0; i-- {
		if tr[i].State == st {
			return tr[i]
		}
	}
	t.Fatalf("no %s event in %v", st, states(tr))
	return tracing.Event{}
}

// TestVouchedDurableSendsAcrossDirectories: API-key and operator bus-key
// durable sends to a peer's agent travel as unsigned frames alpha vouches
// for; beta delivers them attested by its own key (auth "peer", vouchedBy
// alpha) and both traces say how the sender was authenticated. An agent of
// beta that requires end-to-end sender signatures refuses such a message:
// beta records the refusal and alpha records the same error as the
// message's outcome; the agent never sees it.
func TestVouchedDurableSendsAcrossDirectories(t *testing.T) {
	t.Parallel()
	alpha, beta, betaAtt := attestingPair(t)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var mu sync.Mutex
	got := map[string]*agents.Intent{}
	b := beta.agent("b")
	b.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		got[in.Nonce] = in
		mu.Unlock()
		return agents.Success(map[string]any{"ok": true})
	})
	require.NoError(t, b.Connect(ctx))
	strict := beta.agent("strict")
	strict.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		got[in.Nonce] = in
		mu.Unlock()
		return agents.Success(nil)
	})
	require.NoError(t, strict.Connect(ctx))
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, beta.srv.URL+"/agents/strict@beta.beam.directory/config",
		strings.NewReader(`{"requireSenderSignatures":true}`))
	require.NoError(t, err)
	req.Header.Set("x-api-key", strict.APIKey())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	a := sdkAt(t, front.url, "a@alpha.beam.directory")

	for _, c := range []struct{ auth, header, value string }{
		{wire.AttestAPIKey, "x-api-key", a.APIKey()},
		{wire.AttestBusKey, "Authorization", "Bearer " + testBusKey},
	} {
		status, body := busSend(t, ctx, front.url, c.header, c.value,
			`{"from":"a@alpha.beam.directory","to":"b@beta.beam.directory","intent":"task.run","payload":{"n":1}}`)
		require.Equal(t, http.StatusCreated, status, body)
		rec := decodeSend(t, body)
		alpha.waitMessage(rec.Nonce, tracing.Acked)

		mu.Lock()
		in := got[rec.Nonce]
		mu.Unlock()
		require.NotNil(t, in, c.auth)
		require.JSONEq(t, `{"n":1}`, string(in.Payload))
		require.NotNil(t, in.Attested, c.auth)
		require.Equal(t, wire.AttestPeer, in.Attested.Auth)
		require.Equal(t, "alpha.beam.directory", in.Attested.VouchedBy)
		require.Equal(t, "beta.beam.directory", in.Attested.By)
		require.Equal(t, betaAtt.KeyID(), in.Attested.KeyID)

		atr := alpha.trace(rec.Nonce)
		require.Equal(t, []tracing.State{tracing.Received, tracing.Dispatched, tracing.Delivered, tracing.Acked}, lifecycle(atr))
		require.Equal(t, c.auth, atr[1].Details.Extra["vouchedAuth"], "alpha says how it authenticated the sender")
		btr := beta.trace(rec.Nonce)
		require.Equal(t, "alpha.beam.directory", btr[0].Details.Extra["vouchedBy"])
		require.Equal(t, c.auth, btr[0].Details.Extra["vouchedAuth"])
		require.Equal(t, map[string]any{"by": "beta.beam.directory", "keyId": betaAtt.KeyID(), "auth": "peer",
			"vouchedBy": "alpha.beam.directory"}, eventOf(t, btr, tracing.Dispatched).Details.Extra["attestation"])
	}

	// The strict agent refuses a vouched message; both traces say why.
	status, body := busSend(t, ctx, front.url, "x-api-key", a.APIKey(),
		`{"from":"a@alpha.beam.directory","to":"strict@beta.beam.directory","intent":"task.run"}`)
	require.Equal(t, http.StatusCreated, status, body)
	rec := decodeSend(t, body)
	alpha.waitMessage(rec.Nonce, tracing.Failed)
	af := eventOf(t, alpha.trace(rec.Nonce), tracing.Failed)
	require.Equal(t, directory.CodeSenderSignatureRequired, af.Details.ErrorCode)
	require.Contains(t, af.Details.Error, "requireSenderSignatures")
	require.Equal(t, "beta.beam.directory", af.Details.Extra["peer"])
	btr := beta.trace(rec.Nonce)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Failed}, states(btr))
	require.Equal(t, directory.CodeSenderSignatureRequired, btr[1].Details.ErrorCode)
	require.Contains(t, btr[1].Details.Error, "requireSenderSignatures")
	mu.Lock()
	require.NotContains(t, got, rec.Nonce, "the strict agent never sees an attested message")
	mu.Unlock()

	// A sender-signed durable send still reaches it, verbatim.
	signed, err := a.SendDurable(ctx, "strict@beta.beam.directory", "task.run", map[string]any{}, nil)
	require.NoError(t, err)
	alpha.waitMessage(signed.Nonce, tracing.Acked)
	mu.Lock()
	require.Nil(t, got[signed.Nonce].Attested)
	mu.Unlock()
}

// TestVouchedMessageRejections: on the receiving side, an unsigned (vouched)
// frame in a message for a sender outside the origin's domain, a message
// whose origin signature is forged, and a replayed message are rejected,
// counted by reason, never delivered and never recorded.
func TestVouchedMessageRejections(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	_, _ = alpha.registerKey("a")
	b := beta.agent("b")
	var mu sync.Mutex
	var handled []string
	b.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		handled = append(handled, in.Nonce)
		mu.Unlock()
		return agents.Success(nil)
	})
	require.NoError(t, b.Connect(context.Background()))

	nc := peerConn(t, beta, alpha.key, "alpha.beam.directory")
	subj := Subject("beta.beam.directory", "alpha.beam.directory", kindIntent)
	vouched := func(from string) (*wire.IntentFrame, *Message) {
		f := wire.NewIntentFrame(from, "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		now := time.Now()
		return f, &Message{Kind: kindIntent, ID: newID(), From: "alpha.beam.directory", To: "beta.beam.directory",
			IssuedAt: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli(), Nonce: f.Nonce, Frame: string(raw),
			Hop: 1, Path: []string{"alpha.beam.directory"}, TimeoutMs: 5000, EventID: f.Nonce + "/1",
			Owner: string(tracing.OwnerBus), Admitted: now.UnixMilli(), VouchedAuth: wire.AttestAPIKey}
	}
	reply := func(tok []byte) *Message { return requestReply(t, nc, subj, tok, alpha) }
	recorded := func(nonce string) bool {
		_, ok, err := beta.log.Intent(context.Background(), nonce)
		require.NoError(t, err)
		return ok
	}

	// Control: a vouched message for alpha's own agent is delivered.
	good, gm := vouched("a@alpha.beam.directory")
	tok, err := seal(gm, alpha.key)
	require.NoError(t, err)
	m := reply(tok)
	require.Equal(t, statusResult, m.Status, m.Error)

	// 1. Replayed: dropped, counted, delivered only once.
	_, err = nc.Request(subj, tok, 500*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectReplay) == 1 }, 5*time.Second, 10*time.Millisecond)

	// 2. Vouching for a sender of another domain: refused, counted.
	senders := beta.rejectedCount(rejectSender)
	outsider, om := vouched("x@gamma.beam.directory")
	tok, err = seal(om, alpha.key)
	require.NoError(t, err)
	m = reply(tok)
	require.Equal(t, statusError, m.Status)
	require.Equal(t, directory.CodeForbidden, m.ErrorCode)
	require.Equal(t, senders+1, beta.rejectedCount(rejectSender))
	require.False(t, recorded(outsider.Nonce))

	// 3. A forged attestation: the origin's signature made with another key.
	_, rogue, err := wire.GenerateKey()
	require.NoError(t, err)
	forged, fm := vouched("a@alpha.beam.directory")
	tok, err = seal(fm, rogue)
	require.NoError(t, err)
	_, err = nc.Request(subj, tok, 500*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectBadSignature) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.False(t, recorded(forged.Nonce))

	// ... and a genuine message whose frame was altered after signing.
	_, am := vouched("a@alpha.beam.directory")
	tok, err = seal(am, alpha.key)
	require.NoError(t, err)
	parts := strings.Split(string(tok), ".")
	_, om2 := vouched("a@alpha.beam.directory")
	tok2, err := seal(om2, alpha.key)
	require.NoError(t, err)
	spliced := strings.Split(string(tok2), ".")[0] + "." + strings.Split(string(tok2), ".")[1] + "." + parts[2]
	_, err = nc.Request(subj, []byte(spliced), 500*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Eventually(t, func() bool { return beta.rejectedCount(rejectBadSignature) == 2 }, 5*time.Second, 10*time.Millisecond)

	mu.Lock()
	require.Equal(t, []string{good.Nonce}, handled)
	mu.Unlock()
}

// TestNoForwardingThroughIntermediateDirectory: alpha peers with beta and
// beta with gamma, but alpha not with gamma. An intent from alpha to an
// agent of gamma is refused at alpha, sync and durable, with an error that
// says federation does not forward through intermediate directories;
// nothing reaches beta or gamma.
func TestNoForwardingThroughIntermediateDirectory(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	gamma := startDir(t, "gamma.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	pin(t, beta, gamma)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := gamma.agent("c")
	c.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		t.Errorf("c got %s", in.Nonce)
		return agents.Success(nil)
	})
	require.NoError(t, c.Connect(ctx))

	a := alpha.agent("a")
	_, err := a.Send(ctx, "c@gamma.beam.directory", "task.run", map[string]any{})
	require.ErrorContains(t, err, "UNKNOWN_AGENT")
	require.ErrorContains(t, err, "does not forward through intermediate directories")

	status, body := busSend(t, ctx, front.url, "x-api-key", a.APIKey(),
		`{"from":"a@alpha.beam.directory","to":"c@gamma.beam.directory","intent":"task.run"}`)
	require.Equal(t, http.StatusNotFound, status, body)
	require.Contains(t, body, "UNKNOWN_AGENT")
	require.Contains(t, body, "pin its directory as a peer")

	for _, d := range []*fedDir{beta, gamma} {
		for _, peer := range []string{"alpha.beam.directory", "beta.beam.directory"} {
			require.Zero(t, counterValue(t, d.node.m.received.WithLabelValues(peer, kindIntent)), d.domain)
		}
	}
}
