package agents_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// busServer runs a directory with its message bus on a real log.
func busServer(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Synchronous: "NORMAL", Logger: quiet})
	require.NoError(t, err)
	reg, err := registry.Open(ctx, lg, registry.Config{DefaultPolicy: registry.PolicyAllow, Logger: quiet})
	require.NoError(t, err)
	owners := &busOwners{}
	dir, err := directory.New(directory.Config{Log: lg, Registry: reg, Logger: quiet, Owners: owners})
	require.NoError(t, err)
	b, err := bus.New(bus.Config{Log: lg, Directory: dir, Registry: reg, Logger: quiet, BusAPIKey: "bk-test-bus",
		TickInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	owners.bus = b
	_, err = b.Recover(ctx)
	require.NoError(t, err)
	b.Start(ctx)
	mux := http.NewServeMux()
	reg.Routes(mux)
	dir.Routes(mux)
	b.Routes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		_ = b.Close()
		srv.CloseClientConnections()
		_ = dir.Close()
		srv.Close()
		_ = reg.Close(ctx)
		_ = lg.Close()
	})
	return srv.URL
}

func durableAgent(t *testing.T, ctx context.Context, url, beamID string) *agents.Client {
	t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Register(ctx, beamID, nil)
	require.NoError(t, err)
	return c
}

func TestSendDurableAsyncAcceptanceThenAck(t *testing.T) {
	t.Parallel()
	url := busServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sender := durableAgent(t, ctx, url, "sender@acme.beam.directory")
	worker := durableAgent(t, ctx, url, "worker@acme.beam.directory")

	outcomes := make(chan agents.DurableOutcome, 1)
	sender.OnDurableOutcome(func(o agents.DurableOutcome) { outcomes <- o })
	require.NoError(t, sender.Connect(ctx))

	rec, err := sender.SendDurable(ctx, worker.BeamID(), "task.run", map[string]any{"n": 1}, &agents.DurableOptions{TraceID: "t-1"})
	require.NoError(t, err)
	require.Equal(t, "queued", rec.Status)
	require.Equal(t, rec.MessageID, rec.ID, "the receipt names the id both ways")
	again, err := sender.SendDurable(ctx, worker.BeamID(), "task.run", map[string]any{"n": 1}, &agents.DurableOptions{Nonce: rec.Nonce})
	require.NoError(t, err)
	require.True(t, again.Deduped)

	got := make(chan *agents.Intent, 1)
	worker.Handle("task.run", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Accept()
	})
	require.NoError(t, worker.Connect(ctx))
	in := <-got
	require.Equal(t, rec.Nonce, in.Nonce)
	require.Equal(t, rec.MessageID, in.Durable.MessageID)
	require.Equal(t, 1, in.Durable.Attempt)

	var inbox []agents.DurableMessage
	require.Eventually(t, func() bool {
		inbox, err = worker.Poll(ctx, agents.PollOptions{})
		return err == nil && len(inbox) == 1
	}, 10*time.Second, 10*time.Millisecond, "the accepted delivery is in the inbox")
	res, err := worker.Ack(ctx, &inbox[0], agents.AckAcked, map[string]any{"total": 42})
	require.NoError(t, err)
	require.Equal(t, "acked", res.Status)
	require.Equal(t, rec.MessageID, res.ID, "the ack answer names the id both ways")
	o := <-outcomes
	require.Equal(t, rec.MessageID, o.MessageID)
	require.Equal(t, "acked", o.Status)
	require.Contains(t, string(o.Result), `"total":42`)

	m, err := sender.DurableMessageStatus(ctx, rec.MessageID)
	require.NoError(t, err)
	require.Equal(t, "acked", m.Status)
	_, err = worker.Ack(ctx, &inbox[0], agents.AckAcked, nil)
	require.Equal(t, "INVALID_STATE", agents.ErrorCode(err))
}

func TestPollClaimRenewAndAckWithLease(t *testing.T) {
	t.Parallel()
	url := busServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sender := durableAgent(t, ctx, url, "sender@acme.beam.directory")
	poller := durableAgent(t, ctx, url, "poller@acme.beam.directory")
	rec, err := sender.SendDurable(ctx, poller.BeamID(), "job.run", nil, nil)
	require.NoError(t, err)

	msgs, err := poller.Poll(ctx, agents.PollOptions{Claim: true, Lease: 30 * time.Second})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	m := msgs[0]
	require.Equal(t, rec.Nonce, m.Nonce)
	require.NotEmpty(t, m.LeaseID)
	before := m.LeaseExpiry()
	require.NoError(t, poller.RenewLease(ctx, &m, 2*time.Minute))
	require.True(t, m.LeaseExpiry().After(before))

	stolen := m
	stolen.LeaseID = "lease_not_mine"
	_, err = poller.Ack(ctx, &stolen, agents.AckAcked, nil)
	require.Equal(t, "INVALID_STATE", agents.ErrorCode(err))
	res, err := poller.Ack(ctx, &m, agents.AckFailed, map[string]any{"why": "bad input"})
	require.NoError(t, err)
	require.Equal(t, "failed", res.Status)
}

// TestReceiverVerifiesAttestedBusFrames: messages sent with the sender's
// API key and with the operator bus key reach a Go agent signed by the
// directory's attestation key; the agent sees who attested them, how the
// sender was authenticated, and verified them against the key the
// directory publishes at its well-known route.
func TestReceiverVerifiesAttestedBusFrames(t *testing.T) {
	t.Parallel()
	url := busServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sender := durableAgent(t, ctx, url, "sender@acme.beam.directory")
	worker := durableAgent(t, ctx, url, "worker@acme.beam.directory")
	got := make(chan *agents.Intent, 2)
	worker.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Success(nil)
	})
	require.NoError(t, worker.Connect(ctx))

	// The published key document, read independently of the SDK.
	resp, err := http.Get(url + wire.AttestationKeysPath)
	require.NoError(t, err)
	docBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	doc, published, err := wire.DecodeAttestationKeys(docBody)
	require.NoError(t, err)
	require.Len(t, published, 1)

	send := func(header, value string) {
		body := `{"from":"` + sender.BeamID() + `","to":"` + worker.BeamID() + `","intent":"ping","payload":{"n":"ü"}}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/beam/send", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set(header, value)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	for _, c := range []struct{ header, value, auth string }{
		{"X-Api-Key", sender.APIKey(), "api_key"},
		{"Authorization", "Bearer bk-test-bus", "bus_key"},
	} {
		send(c.header, c.value)
		var in *agents.Intent
		select {
		case in = <-got:
		case <-ctx.Done():
			t.Fatalf("%s: the handler never ran", c.auth)
		}
		require.Equal(t, c.auth, in.Durable.Auth)
		require.NotNil(t, in.Attested, "%s: an attested frame is reported as such", c.auth)
		require.Equal(t, c.auth, in.Attested.Auth)
		require.Equal(t, doc.By, in.Attested.By)
		key, ok := published[in.Attested.KeyID]
		require.True(t, ok, "attested with a published key")
		require.True(t, key.Equal(in.Attested.Key))
		require.Nil(t, in.SenderPublicKey, "the attestation key is never presented as the sender's")
		require.NoError(t, wire.VerifyAttested(in.Frame, key))
		require.Equal(t, sender.BeamID(), in.From)
		require.JSONEq(t, `{"n":"ü"}`, string(in.Payload))
	}
}

// TestBeam2SessionReceivesAttestedBusFrame: a Go agent whose session
// speaks beam/2 gets an API-key send as an attested beam/1 frame, verifies
// it against the published key, and its reply acks the message.
func TestBeam2SessionReceivesAttestedBusFrame(t *testing.T) {
	t.Parallel()
	url := busServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sender := durableAgent(t, ctx, url, "sender@acme.beam.directory")
	id, err := agents.GenerateIdentity("worker2@acme.beam.directory")
	require.NoError(t, err)
	worker, err := agents.NewClient(agents.ClientConfig{DirectoryURL: url, Identity: id, Protocol: agents.ProtocolBeam2,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = worker.Close() })
	_, err = worker.Register(ctx, id.BeamID, nil)
	require.NoError(t, err)
	got := make(chan *agents.Intent, 1)
	worker.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Success(map[string]int{"ok": 1})
	})
	require.NoError(t, worker.Connect(ctx))

	body := `{"from":"` + sender.BeamID() + `","to":"` + id.BeamID + `","intent":"job.run"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/beam/send", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", sender.APIKey())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var rec agents.DurableReceipt
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rec))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var in *agents.Intent
	select {
	case in = <-got:
	case <-ctx.Done():
		t.Fatal("the handler never ran")
	}
	require.NotNil(t, in.Attested)
	require.Equal(t, "api_key", in.Attested.Auth)
	require.Equal(t, agents.ProtocolBeam1, in.Protocol)
	require.Eventually(t, func() bool {
		m, err := sender.DurableMessageStatus(ctx, rec.MessageID)
		return err == nil && m.Status == "acked"
	}, 10*time.Second, 10*time.Millisecond)
}

// busOwners is the directory's SessionOwner here: the bus, built after the
// directory and filled in before anything is served.
type busOwners struct{ bus *bus.Bus }

func (o *busOwners) Connected(beamID string) { o.bus.AgentConnected(beamID) }

func (o *busOwners) LateResult(beamID string, rf *wire.ResultFrame) bool {
	return o.bus.LateResult(beamID, rf)
}
