package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/testclock"
)

func TestOfflineRecipientQueuedThenDeliveredOnConnectThenAcked(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	aliceWS := tb.connect(alice)

	status, body := tb.sendAs(alice, bob.id, "task.run", map[string]any{"n": 1}, map[string]any{"trace_id": "tr-1", "priority": 3})
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, "queued", body["status"])
	nonce := nonceOf(t, body)
	m := tb.message(nonce)
	require.Nil(t, m.NextRetryAt, "a message waiting for its recipient has no retry time")
	require.Equal(t, []tracing.State{tracing.Received, tracing.Queued}, tb.states(nonce))
	tb.tick() // nothing is due: still waiting
	require.Equal(t, tracing.Queued, tb.message(nonce).Status)

	// The recipient connects: the message is delivered at once, signed by
	// the directory's attestation key and marked as attested.
	bobWS := tb.connect(bob)
	msg, f := bobWS.nextIntent()
	require.Equal(t, nonce, f.Nonce)
	require.NotNil(t, msg.Attestation)
	require.Equal(t, wire.AttestAPIKey, msg.Attestation.Auth)
	require.Equal(t, tb.dir.Attester().KeyID(), msg.Attestation.KeyID)
	require.Equal(t, tb.dir.Attester().PublicKey(), msg.SenderPublicKey)
	attKey, err := wire.ParsePublicKey(msg.SenderPublicKey)
	require.NoError(t, err)
	require.NoError(t, wire.VerifyAttested(f, attKey))
	require.Error(t, f.Verify(alice.pub), "an attested frame is not the sender's signature")
	require.NotNil(t, msg.Bus)
	require.Equal(t, body["message_id"], msg.Bus.MessageID)
	require.Equal(t, 1, msg.Bus.Attempt)
	require.Equal(t, "api_key", msg.Bus.Auth)
	require.JSONEq(t, `{"n":1}`, string(f.Payload))
	tb.waitStatus(nonce, tracing.Delivered)

	bobWS.respond(nonce, true, `{"done":true}`, "")
	m = tb.waitStatus(nonce, tracing.Acked)
	require.JSONEq(t, `{"done":true}`, string(m.Response))
	require.Equal(t, "tr-1", m.TraceID)
	require.Equal(t, 3, m.Priority)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Queued, tracing.Dispatched, tracing.Delivered, tracing.Acked}, tb.states(nonce))
	trace, err := tb.log.Trace(context.Background(), nonce)
	require.NoError(t, err)
	require.Equal(t, map[string]any{"by": "beam.directory", "keyId": tb.dir.Attester().KeyID(), "auth": "api_key"},
		trace[2].Details.Extra["attestation"], "the dispatched event says the frame was attested")

	// The connected sender hears how its message ended.
	for {
		got := aliceWS.next()
		if got.Type == "result" && got.Bus != nil {
			require.Equal(t, nonce, got.Bus.Nonce)
			require.Equal(t, "acked", got.Bus.Status)
			break
		}
	}
	// The directory never delivers a bus nonce a second time.
	ir, _, err := tb.log.Intent(context.Background(), nonce)
	require.NoError(t, err)
	require.Equal(t, tracing.OwnerBus, ir.Owner)
	require.NotEmpty(t, ir.ResultJSON)
	require.Equal(t, 1.0, counterValue(t, tb.bus.m.outcomes.WithLabelValues("acked")))
}

func TestSendToOnlineRecipientAnswersDelivered(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	done := make(chan map[string]any, 1)
	go func() {
		_, body := tb.sendAs(alice, bob.id, "task.run", nil, nil)
		done <- body
	}()
	_, f := bobWS.nextIntent()
	body := <-done
	require.Equal(t, "delivered", body["status"], body)
	require.Equal(t, f.Nonce, body["nonce"])
	require.Equal(t, []tracing.State{tracing.Received, tracing.Dispatched, tracing.Delivered}, tb.states(f.Nonce))
}

func TestSignedFrameIsForwardedVerbatimAndNonceIsNotRelayedTwice(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	f := wire.NewIntentFrame(alice.id, bob.id, "task.run", json.RawMessage(`{"x":"ü"}`), tb.clock.Now())
	require.NoError(t, wire.SignIntent(f, alice.priv))
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)

	status, body := tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": json.RawMessage(raw)})
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, f.Nonce, body["nonce"])

	// A POST /intents/send of the same frame is not delivered by the directory.
	resp, err := http.Post(tb.srv.URL+"/intents/send", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode)

	bobWS := tb.connect(bob)
	msg, got := bobWS.nextIntent()
	require.Equal(t, "signature", msg.Bus.Auth)
	require.NoError(t, got.Verify(alice.pub), "the forwarded frame still verifies")
	require.Equal(t, f.Timestamp, got.Timestamp)

	// A forged signature is refused and not recorded.
	f2 := wire.NewIntentFrame(alice.id, bob.id, "task.run", nil, tb.clock.Now())
	require.NoError(t, wire.SignIntent(f2, bob.priv))
	raw2, _ := f2.DeliveryJSON()
	status, body = tb.call(http.MethodPost, "/v1/beam/send", "", "", raw2)
	require.Equal(t, http.StatusUnauthorized, status, body)
	require.Equal(t, "UNAUTHORIZED", body["errorCode"])
	_, ok, err := tb.log.Intent(context.Background(), f2.Nonce)
	require.NoError(t, err)
	require.False(t, ok)
}

func TestFailingAgentRetriesOnScheduleThenDeadLetterThenRequeue(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)

	done := make(chan map[string]any, 1)
	go func() {
		_, body := tb.sendAs(alice, bob.id, "task.run", map[string]any{"k": "v"}, nil)
		done <- body
	}()
	var nonce string
	for attempt := 1; attempt <= defaultMaxAttempts; attempt++ {
		msg, f := bobWS.nextIntent()
		require.Equal(t, attempt, msg.Bus.Attempt)
		nonce = f.Nonce
		tb.waitStatus(nonce, tracing.Delivered)
		before := tb.clock.Now()
		bobWS.respond(nonce, false, "", "BACKEND_DOWN")
		if attempt == defaultMaxAttempts {
			break
		}
		m := tb.waitStatus(nonce, tracing.Queued)
		require.Equal(t, attempt, m.RetryCount)
		want := before.Add(tb.bus.Delay(nonce, attempt))
		require.NotNil(t, m.NextRetryAt)
		require.InDelta(t, secs(want), *m.NextRetryAt, 0.002)
		base := defaultSchedule[attempt-1]
		d := tb.bus.Delay(nonce, attempt)
		require.GreaterOrEqual(t, d, base*85/100)
		require.LessOrEqual(t, d, base*115/100)

		// Not due yet: a tick does nothing.
		tb.clock.Advance(d - time.Second)
		tb.tick()
		require.Equal(t, tracing.Queued, tb.message(nonce).Status)
		tb.clock.Advance(time.Second)
		tb.tick()
	}
	<-done
	m := tb.waitStatus(nonce, tracing.DeadLetter)
	require.Equal(t, defaultMaxAttempts, m.RetryCount)
	ir, _, err := tb.log.Intent(context.Background(), nonce)
	require.NoError(t, err)
	require.Equal(t, "BACKEND_DOWN", ir.ErrorCode)

	status, dl := tb.call(http.MethodGet, "/v1/beam/dead-letter", "", testBusKey, nil)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 1, dl["count"])

	// Operator requeue: delivered again with the same nonce, then acked.
	reqDone := make(chan map[string]any, 1)
	go func() {
		_, body := tb.call(http.MethodPost, "/v1/beam/dead-letter/"+m.ID+"/requeue", "", testBusKey, nil)
		reqDone <- body
	}()
	msg, f := bobWS.nextIntent()
	require.Equal(t, nonce, f.Nonce)
	require.Equal(t, defaultMaxAttempts+1, msg.Bus.Attempt)
	body := <-reqDone
	require.Equal(t, true, body["requeued"])
	require.Equal(t, "delivered", body["status"], body)
	bobWS.respond(nonce, true, `{}`, "")
	m = tb.waitStatus(nonce, tracing.Acked)
	require.Equal(t, 0, m.RetryCount)

	// Every attempt is in the trace.
	evs, err := tb.log.Trace(context.Background(), nonce)
	require.NoError(t, err)
	attempts := map[int]bool{}
	for _, ev := range evs {
		if ev.State == tracing.Dispatched {
			attempts[ev.Attempt] = true
		}
	}
	require.Len(t, attempts, defaultMaxAttempts+1)
	require.Equal(t, float64(defaultMaxAttempts-1), counterValue(t, tb.bus.m.retries))
	require.Equal(t, 1.0, counterValue(t, tb.bus.m.deadLetters))
}

func TestNonRetryableFailureDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	sent := tb.sendAsync(alice, bob.id, "task.run")
	defer func() { <-sent }()
	_, f := bobWS.nextIntent()
	bobWS.respond(f.Nonce, false, "", "UNSUPPORTED_INTENT")
	m := tb.waitStatus(f.Nonce, tracing.DeadLetter)
	require.Equal(t, 1, m.RetryCount)
}

func TestTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.DeliveryTimeout = 100 * time.Millisecond; c.SendWait = time.Millisecond }
	})
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	_, body := tb.sendAs(alice, bob.id, "task.run", nil, nil)
	nonce := nonceOf(t, body)
	bobWS.nextIntent()
	m := tb.waitStatus(nonce, tracing.Queued)
	require.Equal(t, 1, m.RetryCount)
	ir, _, err := tb.log.Intent(context.Background(), nonce)
	require.NoError(t, err)
	require.Equal(t, "TIMEOUT", ir.ErrorCode)
}

func TestAsyncAcceptanceStaysDeliveredUntilAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	sent := tb.sendAsync(alice, bob.id, "task.run")
	defer func() { <-sent }()
	_, f := bobWS.nextIntent()
	bobWS.respond(f.Nonce, true, `{"accepted":true,"acknowledgement":"accepted","terminal":false}`, "")
	require.Eventually(t, func() bool {
		evs, _ := tb.log.Trace(context.Background(), f.Nonce)
		return len(evs) == 4 && evs[3].Details.Extra["asyncAccepted"] == true
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, tracing.Delivered, tb.message(f.Nonce).Status)

	// The poll shows the accepted, non-terminal delivery.
	status, body := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id, bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["count"])
	// The sender may not poll bob's inbox nor ack bob's message.
	status, _ = tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id, alice.apiKey, "", nil)
	require.Equal(t, http.StatusForbidden, status)
	status, body = tb.call(http.MethodPost, "/v1/beam/ack", alice.apiKey, "", map[string]any{"nonce": f.Nonce})
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "FORBIDDEN", body["errorCode"])

	status, body = tb.call(http.MethodPost, "/v1/beam/ack", bob.apiKey, "", map[string]any{"nonce": f.Nonce, "response": map[string]any{"ok": 1}})
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "acked", body["status"])
	m := tb.message(f.Nonce)
	require.JSONEq(t, `{"ok":1}`, string(m.Response))
	// A second ack is in the wrong state.
	status, body = tb.call(http.MethodPost, "/v1/beam/ack", bob.apiKey, "", map[string]any{"nonce": f.Nonce})
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "INVALID_STATE", body["errorCode"])
}

func TestLeaseExpiryRedeliversToNextPollerAndRefusesLateAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	_, body := tb.sendAs(alice, bob.id, "task.run", map[string]any{"job": 7}, nil)
	nonce := nonceOf(t, body)

	status, p1 := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=true&lease=30", bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, p1)
	require.EqualValues(t, 1, p1["count"])
	lease1, _ := p1["lease_id"].(string)
	require.NotEmpty(t, lease1)
	m := tb.message(nonce)
	require.Equal(t, tracing.Dispatched, m.Status)
	require.Equal(t, lease1, m.LeaseOwner)

	// Nothing else to claim while the lease holds.
	_, p := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=true", bob.apiKey, "", nil)
	require.EqualValues(t, 0, p["count"])

	// Renewal extends the lease.
	status, rn := tb.call(http.MethodPost, "/v1/beam/lease", bob.apiKey, "", map[string]any{"nonce": nonce, "lease_id": lease1, "lease": 40})
	require.Equal(t, http.StatusOK, status, rn)
	tb.clock.Advance(35 * time.Second)
	tb.tick()
	require.Equal(t, tracing.Dispatched, tb.message(nonce).Status)

	tb.clock.Advance(10 * time.Second)
	tb.tick()
	m = tb.message(nonce)
	require.Equal(t, tracing.Queued, m.Status)
	require.Equal(t, 1, m.RetryCount, "the expired lease counts as an attempt")

	status, p2 := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=true&lease=30", bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 1, p2["count"])
	lease2, _ := p2["lease_id"].(string)
	require.NotEqual(t, lease1, lease2)

	status, late := tb.call(http.MethodPost, "/v1/beam/ack", bob.apiKey, "", map[string]any{"nonce": nonce, "lease_id": lease1})
	require.Equal(t, http.StatusConflict, status, late)
	require.Equal(t, "INVALID_STATE", late["errorCode"])
	require.Equal(t, "LEASE_MISMATCH", late["reason"])

	status, ok := tb.call(http.MethodPost, "/v1/beam/ack", bob.apiKey, "", map[string]any{"message_id": body["message_id"], "lease_id": lease2})
	require.Equal(t, http.StatusOK, status, ok)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Queued, tracing.Dispatched, tracing.Dispatched,
		tracing.Queued, tracing.Queued, tracing.Dispatched, tracing.Delivered, tracing.Acked}, tb.states(nonce),
		"expired lease → due at once → (no session) waiting → claimed → acked")
}

func TestLeaseExpiryDeadLettersAfterLastAttempt(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.MaxAttempts = 2 } })
	alice, bob := tb.register("alice"), tb.register("bob")
	_, body := tb.sendAs(alice, bob.id, "task.run", nil, nil)
	nonce := nonceOf(t, body)
	for range 2 {
		_, p := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=1&lease=5", bob.apiKey, "", nil)
		require.EqualValues(t, 1, p["count"])
		tb.clock.Advance(6 * time.Second)
		tb.tick()
	}
	require.Equal(t, tracing.DeadLetter, tb.message(nonce).Status)
}

func TestRestartRules(t *testing.T) {
	t.Parallel()
	clock := testclock.NewNow()
	path := t.TempDir() + "/beam.db"
	tb := setup(t, func(o *setupOpts) { o.path, o.clock = path, clock })
	alice, bob := tb.register("alice"), tb.register("bob")
	_, b1 := tb.sendAs(alice, bob.id, "task.dispatched", nil, nil)
	_, b2 := tb.sendAs(alice, bob.id, "task.scheduled", nil, nil)
	n1, n2 := nonceOf(t, b1), nonceOf(t, b2)
	// n1 was in a WebSocket attempt when the process died.
	m1 := tb.message(n1)
	ev := event(m1, tracing.Dispatched, transportWS, 1)
	_, err := tb.log.Append(context.Background(), ev)
	require.NoError(t, err)
	// n2 waits for a scheduled retry.
	m2 := tb.message(n2)
	one := 1
	retryAt := clock.Now().Add(90 * time.Second)
	ev = event(m2, tracing.Queued, transportBus, 1)
	ev.Details = tracing.Details{RetryCount: &one, NextRetryAt: retryAt.UnixMilli(), ErrorCode: "TIMEOUT"}
	_, err = tb.log.Append(context.Background(), ev)
	require.NoError(t, err)
	tb.close()

	tb2 := setup(t, func(o *setupOpts) { o.path, o.clock = path, clock })
	m1 = tb2.message(n1)
	require.Equal(t, tracing.Queued, m1.Status)
	require.NotNil(t, m1.NextRetryAt)
	require.InDelta(t, secs(clock.Now()), *m1.NextRetryAt, 0.002)
	m2 = tb2.message(n2)
	require.InDelta(t, secs(retryAt), *m2.NextRetryAt, 0.002, "the retry window survives the restart")

	bobWS := tb2.connect(bob)
	_, f := bobWS.nextIntent()
	require.Equal(t, n1, f.Nonce, "the interrupted message is delivered again with the same nonce")
	bobWS.respond(n1, true, "", "")
	tb2.waitStatus(n1, tracing.Acked)
	require.Equal(t, tracing.Queued, tb2.message(n2).Status)
	clock.Advance(90 * time.Second)
	tb2.tick()
	_, f = bobWS.nextIntent()
	require.Equal(t, n2, f.Nonce)
}

func TestRecoveredDeliveredTimesOutWithoutResult(t *testing.T) {
	t.Parallel()
	clock := testclock.NewNow()
	path := t.TempDir() + "/beam.db"
	tb := setup(t, func(o *setupOpts) { o.path, o.clock = path, clock })
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	sent := tb.sendAsync(alice, bob.id, "task.run")
	defer func() { <-sent }()
	_, f := bobWS.nextIntent()
	tb.waitStatus(f.Nonce, tracing.Delivered)
	<-sent
	tb.close()

	tb2 := setup(t, func(o *setupOpts) { o.path, o.clock = path, clock })
	require.Equal(t, tracing.Delivered, tb2.message(f.Nonce).Status, "delivered is unchanged at restart")
	clock.Advance(defaultDeliveryTimeout + time.Second)
	tb2.tick()
	m := tb2.message(f.Nonce)
	require.Equal(t, tracing.Queued, m.Status)
	require.Equal(t, 1, m.RetryCount)
}

func TestBadInputGetsDocumentedErrors(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob, carol := tb.register("alice"), tb.register("bob"), tb.register("carol")
	_, queued := tb.sendAs(alice, bob.id, "task.run", map[string]any{"a": 1}, map[string]any{"nonce": "fixed-nonce-1"})
	msgID, _ := queued["message_id"].(string)

	cases := []struct {
		name         string
		method, path string
		key, bearer  string
		body         any
		status       int
		code         string
	}{
		{"malformed json", "POST", "/v1/beam/send", alice.apiKey, "", "{not json", 400, "INVALID_JSON"},
		{"json array", "POST", "/v1/beam/send", alice.apiKey, "", "[1]", 400, "INVALID_JSON"},
		{"missing fields", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id}, 400, "MISSING_REQUIRED_FIELDS"},
		{"wrong field type", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id, "to": 5, "intent": "x"}, 400, "MISSING_REQUIRED_FIELDS"},
		{"payload not object", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id, "to": bob.id, "intent": "x", "payload": []int{1}}, 400, "INVALID_PAYLOAD"},
		{"no auth", "POST", "/v1/beam/send", "", "", map[string]any{"from": alice.id, "to": bob.id, "intent": "x"}, 401, "UNAUTHORIZED"},
		{"bad key", "POST", "/v1/beam/send", "bk_nope", "", map[string]any{"from": alice.id, "to": bob.id, "intent": "x"}, 401, "UNAUTHORIZED"},
		{"bad bearer", "POST", "/v1/beam/send", "", "wrong", map[string]any{"from": alice.id, "to": bob.id, "intent": "x"}, 401, "UNAUTHORIZED"},
		{"send as someone else", "POST", "/v1/beam/send", carol.apiKey, "", map[string]any{"from": alice.id, "to": bob.id, "intent": "x"}, 403, "FORBIDDEN"},
		{"unknown recipient", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id, "to": "nobody@acme.beam.directory", "intent": "x"}, 404, "UNKNOWN_AGENT"},
		{"bus key unknown sender", "POST", "/v1/beam/send", "", testBusKey, map[string]any{"from": "ghost@acme.beam.directory", "to": bob.id, "intent": "x"}, 404, "UNKNOWN_AGENT"},
		{"oversized payload", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id, "to": bob.id, "intent": "x", "payload": map[string]any{"big": strings.Repeat("x", 5000)}}, 413, "PAYLOAD_TOO_LARGE"},
		{"oversized body", "POST", "/v1/beam/send", alice.apiKey, "", `{"pad":"` + strings.Repeat("x", 70000) + `"}`, 413, "PAYLOAD_TOO_LARGE"},
		{"nonce reuse", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id, "to": bob.id, "intent": "task.run", "payload": map[string]any{"a": 2}, "nonce": "fixed-nonce-1"}, 409, "NONCE_REUSE_CONFLICT"},
		{"bad priority", "POST", "/v1/beam/send", alice.apiKey, "", map[string]any{"from": alice.id, "to": bob.id, "intent": "x", "priority": "high"}, 400, "INVALID_PAYLOAD"},
		{"ack malformed", "POST", "/v1/beam/ack", bob.apiKey, "", "nope", 400, "INVALID_JSON"},
		{"ack no id", "POST", "/v1/beam/ack", bob.apiKey, "", map[string]any{"status": "acked"}, 400, "MISSING_MESSAGE_ID"},
		{"ack bad status", "POST", "/v1/beam/ack", bob.apiKey, "", map[string]any{"message_id": msgID, "status": "done"}, 400, "INVALID_STATUS"},
		{"ack unknown", "POST", "/v1/beam/ack", bob.apiKey, "", map[string]any{"message_id": "0000"}, 404, "MESSAGE_NOT_FOUND"},
		{"ack someone else's", "POST", "/v1/beam/ack", carol.apiKey, "", map[string]any{"message_id": msgID}, 403, "FORBIDDEN"},
		{"ack wrong state", "POST", "/v1/beam/ack", bob.apiKey, "", map[string]any{"message_id": msgID}, 409, "INVALID_STATE"},
		{"ack unauthenticated", "POST", "/v1/beam/ack", "", "", map[string]any{"message_id": msgID}, 401, "UNAUTHORIZED"},
		{"poll no agent", "GET", "/v1/beam/poll", bob.apiKey, "", nil, 400, "MISSING_AGENT"},
		{"poll unknown agent", "GET", "/v1/beam/poll?agent=ghost@acme.beam.directory", "", testBusKey, nil, 404, "UNKNOWN_AGENT"},
		{"poll bad status", "GET", "/v1/beam/poll?agent=" + bob.id + "&status=weird", bob.apiKey, "", nil, 400, "INVALID_STATUS"},
		{"poll bad lease", "GET", "/v1/beam/poll?agent=" + bob.id + "&claim=true&lease=-1", bob.apiKey, "", nil, 400, "INVALID_PAYLOAD"},
		{"requeue as agent", "POST", "/v1/beam/dead-letter/" + msgID + "/requeue", bob.apiKey, "", nil, 403, "FORBIDDEN"},
		{"requeue not dead", "POST", "/v1/beam/dead-letter/" + msgID + "/requeue", "", testBusKey, nil, 409, "INVALID_STATE"},
		{"requeue unknown", "POST", "/v1/beam/dead-letter/nope/requeue", "", testBusKey, nil, 404, "MESSAGE_NOT_FOUND"},
		{"history unauthenticated", "GET", "/v1/beam/history", "", "", nil, 401, "UNAUTHORIZED"},
		{"stats bad token", "GET", "/v1/beam/stats", "", "x", nil, 401, "UNAUTHORIZED"},
		{"message of others", "GET", "/v1/beam/messages/" + msgID, carol.apiKey, "", nil, 403, "FORBIDDEN"},
		{"lease unknown", "POST", "/v1/beam/lease", bob.apiKey, "", map[string]any{"message_id": msgID, "lease_id": "l"}, 409, "INVALID_STATE"},
	}
	for _, c := range cases {
		status, body := tb.call(c.method, c.path, c.key, c.bearer, c.body)
		require.Equal(t, c.status, status, "%s: %v", c.name, body)
		require.Equal(t, c.code, body["errorCode"], c.name)
		require.NotEmpty(t, body["error"], c.name)
	}

	// An identical resend is deduplicated.
	status, body := tb.sendAs(alice, bob.id, "task.run", map[string]any{"a": 1}, map[string]any{"nonce": "fixed-nonce-1"})
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, true, body["deduped"])
	require.Equal(t, msgID, body["message_id"])
	// The bus key may send for a local agent.
	status, body = tb.call(http.MethodPost, "/v1/beam/send", "", testBusKey, map[string]any{"sender": alice.id, "to": bob.id, "intent": "x"})
	require.Equal(t, http.StatusCreated, status, body)

	// History, stats and the message itself.
	status, body = tb.call(http.MethodGet, "/v1/beam/history?sender="+alice.id, "", testBusKey, nil)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 2, body["count"])
	status, body = tb.call(http.MethodGet, "/v1/beam/history", carol.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 0, body["count"], "agents see only their own messages")
	status, body = tb.call(http.MethodGet, "/v1/beam/stats", "", testBusKey, nil)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 2, body["total"])
	require.EqualValues(t, 2, body["queued"])
	require.EqualValues(t, 2, body["last_24h"])
	status, body = tb.call(http.MethodGet, "/v1/beam/messages/"+msgID, bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "queued", body["status"])
	families, err := tb.prom.Gather()
	require.NoError(t, err)
	depth := map[string]float64{}
	for _, fam := range families {
		if fam.GetName() == "beam_bus_messages" {
			for _, m := range fam.GetMetric() {
				depth[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	require.Len(t, depth, len(tracing.States))
	require.Equal(t, 2.0, depth["queued"])
}

func TestDelayScheduleAndJitter(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 6; n++ {
		base := defaultSchedule[min(n-1, len(defaultSchedule)-1)]
		d := delay(defaultSchedule, defaultJitter, "nonce-x", n)
		require.GreaterOrEqual(t, d, base*85/100)
		require.LessOrEqual(t, d, base*115/100)
		require.Equal(t, d, delay(defaultSchedule, defaultJitter, "nonce-x", n), "deterministic")
	}
	require.Equal(t, time.Second, delay([]time.Duration{time.Second}, 0, "n", 3))
	d := delay([]time.Duration{time.Second}, 0.15, "n", 3)
	require.True(t, d >= 850*time.Millisecond && d <= 1150*time.Millisecond, "test schedules below 5 s are kept: %s", d)
}

// TestDelayKeepsTheReferenceSpread checks the backoff draw against the
// reference's integer spread: base + base·pct/100 with pct in [-p, +p]
// picked by the 31-multiplier hash of "nonce:n", floored at 5 s (the draw
// goes through floating point, so a nanosecond apart at most).
func TestDelayKeepsTheReferenceSpread(t *testing.T) {
	t.Parallel()
	schedules := [][]time.Duration{defaultSchedule, {time.Second}, {7 * time.Second, 333 * time.Millisecond}}
	for _, schedule := range schedules {
		for _, jitter := range []float64{0.15, 0.5, 0.01, 0.004} {
			for i := range 500 {
				nonce := fmt.Sprintf("nonce-%d-ü-%x", i, i*7919)
				for n := 1; n <= 5; n++ {
					base := schedule[min(n-1, len(schedule)-1)]
					p := int64(jitter*100 + 0.5)
					want := base
					if p > 0 {
						h := stringHash(nonce + ":" + strconv.Itoa(n))
						if h < 0 {
							h = -h
						}
						want = max(base+time.Duration(int64(base)*(h%(2*p+1)-p)/100), min(minDelay, base))
					}
					got := delay(schedule, jitter, nonce, n)
					require.LessOrEqual(t, (got - want).Abs(), time.Nanosecond, "%s attempt %d jitter %v", nonce, n, jitter)
				}
			}
		}
	}
}

// FuzzSendBody feeds arbitrary bodies to POST /v1/beam/send: every answer
// is a documented error or a success, never a 500.
func FuzzSendBody(f *testing.F) {
	tb := setup(f)
	alice, bob := tb.register("alice"), tb.register("bob")
	f.Add([]byte(`{"from":"` + alice.id + `","to":"` + bob.id + `","intent":"x","payload":{"a":1}}`))
	f.Add([]byte(`{"frame":{"v":"1","intent":"x","from":"` + alice.id + `","to":"` + bob.id + `","payload":{},"nonce":"n","timestamp":"2020-01-01T00:00:00.000Z","signature":"AAAA"}}`))
	f.Add([]byte(`{"frame":"e30.e30.e30"}`))
	f.Add([]byte(`{"from":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/beam/send", bytes.NewReader(body))
		req.Header.Set("X-Api-Key", alice.apiKey)
		rec := httptest.NewRecorder()
		tb.bus.api(tb.bus.handleSend)(rec, req)
		require.NotEqual(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
		if rec.Code >= 400 {
			var e map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e))
			require.NotEmpty(t, e["errorCode"])
		}
	})
}

func counterValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// TestMessageIDUnderBothNames: the send receipt and the messages of poll
// carry the message's id under both names, message_id (the receipt's, as
// the reference answers send) and id (the reference's poll rows).
func TestMessageIDUnderBothNames(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "task.run", map[string]any{"n": 1}, nil)
	require.Equal(t, http.StatusCreated, status, body)
	require.NotEmpty(t, body["message_id"])
	require.Equal(t, body["message_id"], body["id"])

	status, polled := tb.call(http.MethodGet, "/v1/beam/poll?claim=true&agent="+url.QueryEscape(bob.id), bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, polled)
	msgs, _ := polled["messages"].([]any)
	require.Len(t, msgs, 1, polled)
	m := msgs[0].(map[string]any)
	require.Equal(t, body["message_id"], m["id"])
	require.Equal(t, body["message_id"], m["message_id"])
}

// A message's id is both id and message_id in every bus answer that names
// it: the send receipt, a lease renewal and an ack.
func TestEveryAnswerCarriesIDAndMessageID(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	_, sent := tb.sendAs(alice, bob.id, "task.run", map[string]any{"job": 1}, nil)
	id, _ := sent["message_id"].(string)
	require.NotEmpty(t, id, sent)
	require.Equal(t, id, sent["id"], "send receipt")

	status, p := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=true&lease=30", bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, p)
	lease, _ := p["lease_id"].(string)
	require.NotEmpty(t, lease, p)

	status, renewed := tb.call(http.MethodPost, "/v1/beam/lease", bob.apiKey, "", map[string]any{"message_id": id, "lease_id": lease, "lease": 40})
	require.Equal(t, http.StatusOK, status, renewed)
	require.Equal(t, id, renewed["message_id"])
	require.Equal(t, id, renewed["id"], "lease answer")

	status, acked := tb.call(http.MethodPost, "/v1/beam/ack", bob.apiKey, "", map[string]any{"message_id": id, "lease_id": lease})
	require.Equal(t, http.StatusOK, status, acked)
	require.Equal(t, id, acked["message_id"])
	require.Equal(t, id, acked["id"], "ack answer")
}
