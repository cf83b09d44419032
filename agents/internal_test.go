package agents

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

// offlineClient is a client that never dials; enough to exercise decoding
// and verification.
func offlineClient(t *testing.T, beamID string, now time.Time) (*Client, *Identity) {
	t.Helper()
	id, err := GenerateIdentity(beamID)
	require.NoError(t, err)
	c, err := NewClient(ClientConfig{
		DirectoryURL: "http://127.0.0.1:1",
		Identity:     id,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock:        func() time.Time { return now },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, id
}

func signedEnvelope(t *testing.T, from *Identity, to, intent, payload string, at time.Time) envelope {
	t.Helper()
	f := wire.NewIntentFrame(from.BeamID, to, intent, json.RawMessage(payload), at)
	require.NoError(t, wire.SignIntent(f, from.Private))
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	return envelope{Type: "intent", Frame: raw, SenderPublicKey: from.PublicKeyBase64()}
}

func TestVerifyIncoming(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	c, _ := offlineClient(t, "bob@acme.beam.directory", now)
	alice, err := GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	mallory, err := GenerateIdentity("mallory@acme.beam.directory")
	require.NoError(t, err)

	env := signedEnvelope(t, alice, "bob@acme.beam.directory", "agent.ping", `{"b":1,"a":"ü"}`, now.Add(-time.Minute))
	in, err := c.verifyIncoming(env)
	require.NoError(t, err)
	require.Equal(t, "alice@acme.beam.directory", in.From)
	require.Equal(t, `{"b":1,"a":"ü"}`, string(in.Payload))

	forged := env
	forged.SenderPublicKey = mallory.PublicKeyBase64()
	_, err = c.verifyIncoming(forged)
	require.ErrorIs(t, err, wire.ErrBadSignature)

	noKey := env
	noKey.SenderPublicKey = ""
	_, err = c.verifyIncoming(noKey)
	require.Error(t, err)

	_, err = c.verifyIncoming(signedEnvelope(t, alice, "carol@acme.beam.directory", "agent.ping", `{}`, now))
	require.ErrorContains(t, err, "addressed to")

	_, err = c.verifyIncoming(signedEnvelope(t, alice, "bob@acme.beam.directory", "agent.ping", `{}`, now.Add(-6*time.Minute)))
	require.ErrorContains(t, err, "replay window")
	_, err = c.verifyIncoming(signedEnvelope(t, alice, "bob@acme.beam.directory", "agent.ping", `{}`, now.Add(6*time.Minute)))
	require.ErrorContains(t, err, "replay window")

	tampered := env
	tampered.Frame = json.RawMessage(string(env.Frame[:len(env.Frame)-1]) + `,"payload":{"b":2,"a":"ü"}}`)
	_, err = c.verifyIncoming(tampered)
	require.Error(t, err)
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	c, _ := offlineClient(t, "bob@acme.beam.directory", time.Now())
	c.cfg.ReconnectMin, c.cfg.ReconnectMax = 100*time.Millisecond, 2*time.Second
	for n := 0; n < 40; n++ {
		d := c.backoff(n)
		want := c.cfg.ReconnectMin << min(n, 10)
		if want > c.cfg.ReconnectMax {
			want = c.cfg.ReconnectMax
		}
		require.GreaterOrEqual(t, d, want/2, "attempt %d", n)
		require.LessOrEqual(t, d, want, "attempt %d", n)
	}
}

func TestEncodePayload(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   any
		want string
		ok   bool
	}{
		{nil, `{}`, true},
		{json.RawMessage(nil), `{}`, true},
		{[]byte("  "), `{}`, true},
		{json.RawMessage(` {"a":1} `), `{"a":1}`, true},
		{[]byte(`{"x":[1,2]}`), `{"x":[1,2]}`, true},
		{map[string]string{"m": "<&>"}, `{"m":"<&>"}`, true},
		{struct {
			B int `json:"b"`
			A int `json:"a"`
		}{1, 2}, `{"b":1,"a":2}`, true},
		{"text", ``, false},
		{[]int{1}, ``, false},
		{json.RawMessage(`{"a":`), ``, false},
		{func() {}, ``, false},
	} {
		got, err := encodePayload(tc.in)
		if !tc.ok {
			require.Error(t, err, "%v", tc.in)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, string(got))
	}
}

func TestReplyFrames(t *testing.T) {
	t.Parallel()
	// Replies are built and signed without a session; check the frames
	// that would go out.
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	_, id := offlineClient(t, "bob@acme.beam.directory", now)
	for _, tc := range []struct {
		r       Reply
		success bool
		payload string
		code    string
	}{
		{Success(map[string]int{"n": 1}), true, `{"n":1}`, ""},
		{Reply{}, true, ``, ""},
		{Accept(), true, `{"accepted":true,"acknowledgement":"accepted","terminal":false}`, ""},
		{Failure("NOPE", "no"), false, ``, "NOPE"},
		{Failure("", "no"), false, ``, "INTENT_FAILED"},
		{Success("not an object"), false, ``, "INTENT_HANDLER_ERROR"},
	} {
		res := resultFor("n-1", tc.r)
		lat := int64(3)
		res.Latency = &lat
		frame, err := res.Build(now, id.Private)
		require.NoError(t, err)
		rf, err := wire.DecodeResultFrame(frame)
		require.NoError(t, err)
		require.NoError(t, rf.Verify(id.Public))
		require.Equal(t, tc.success, rf.Success)
		require.Equal(t, tc.code, rf.ErrorCode)
		if tc.payload != "" {
			require.JSONEq(t, tc.payload, string(rf.Payload))
		} else {
			require.Empty(t, rf.Payload)
		}
		require.Equal(t, tc.success && tc.r.payload != nil && tc.code == "" && string(rf.Payload) == `{"accepted":true,"acknowledgement":"accepted","terminal":false}`, wire.IsAsyncAcceptance(rf))
	}
}

func FuzzDispatch(f *testing.F) {
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	f.Add([]byte(`{"type":"connected","beamId":"bob@acme.beam.directory","auth":"api_key"}`))
	f.Add([]byte(`{"type":"result","frame":{"v":"1","success":true,"nonce":"n","timestamp":"t"}}`))
	f.Add([]byte(`{"type":"error","nonce":"n","errorCode":"OFFLINE","message":"x"}`))
	f.Add([]byte(`{"type":"intent","frame":{"v":"1","intent":"a","from":"a@beam.directory","to":"bob@acme.beam.directory","payload":{},"nonce":"n","timestamp":"2026-03-30T15:00:00.000Z","signature":"AAAA"},"senderPublicKey":"MCowBQYDK2VwAyEAQYvLymXtml/R0LTxPO7RlIZBV/WyfVi2RowyLoNwVuw="}`))
	f.Add([]byte(`not json`))
	f.Add([]byte(`{"type":"intent","frame":[1,2]}`))
	// A genuinely signed intent, so the fuzzer starts from one that runs.
	alice, err := GenerateIdentity("alice@acme.beam.directory")
	if err != nil {
		f.Fatal(err)
	}
	fr := wire.NewIntentFrame(alice.BeamID, "bob@acme.beam.directory", "x", json.RawMessage(`{"k":1}`), now)
	if err := wire.SignIntent(fr, alice.Private); err != nil {
		f.Fatal(err)
	}
	raw, err := fr.DeliveryJSON()
	if err != nil {
		f.Fatal(err)
	}
	signed, err := json.Marshal(map[string]any{"type": "intent", "frame": json.RawMessage(raw), "senderPublicKey": wire.EncodePublicKey(alice.Public)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(signed)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _ := offlineClient(t, "bob@acme.beam.directory", now)
		var ran []*Intent
		var mu sync.Mutex
		c.Handle("*", func(_ context.Context, in *Intent) Reply {
			mu.Lock()
			ran = append(ran, in)
			mu.Unlock()
			return Success(in.Payload)
		})
		c.dispatch(data) // must not panic; nothing to answer without a session
		c.wg.Wait()

		// Invariant: the handler runs exactly for an intent addressed to
		// this agent that verifies, and sees that intent.
		var env envelope
		want := json.Unmarshal(data, &env) == nil && env.Type == "intent"
		var in *Intent
		if want {
			var err error
			in, err = c.verifyIncoming(env)
			want = err == nil
		}
		if !want {
			require.Empty(t, ran, "a message that does not verify reached the handler: %q", data)
			return
		}
		require.Len(t, ran, 1)
		require.Equal(t, in.Nonce, ran[0].Nonce)
		require.Equal(t, in.From, ran[0].From)
		require.Equal(t, "bob@acme.beam.directory", in.To)
		if env.JWS == "" {
			// Every beam/1 frame that runs is signed under the key it came
			// with: the sender's, or the directory's attestation key.
			pub, err := wire.ParsePublicKey(env.SenderPublicKey)
			require.NoError(t, err)
			fr, err := wire.DecodeIntentFrame(env.Frame)
			require.NoError(t, err)
			require.NoError(t, fr.Verify(pub))
		}
	})
}

func FuzzIdentityJSON(f *testing.F) {
	id, err := GenerateIdentity("alice@acme.beam.directory")
	if err != nil {
		f.Fatal(err)
	}
	good, err := json.Marshal(id)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"beamId":"a@beam.directory","publicKeyBase64":"MCowBQYDK2VwAyEA","privateKeyBase64":""}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var id Identity
		if err := json.Unmarshal(data, &id); err != nil {
			return
		}
		out, err := json.Marshal(&id)
		require.NoError(t, err, "a decoded identity re-encodes")
		var again Identity
		require.NoError(t, json.Unmarshal(out, &again))
		require.Equal(t, id.BeamID, again.BeamID)
		require.Equal(t, id.Private, again.Private)
	})
}

func FuzzAgentJSON(f *testing.F) {
	f.Add([]byte(`{"beam_id":"a@x.beam.directory","display_name":"A","capabilities":["q"],"trust_score":0.5,"verified":false}`))
	f.Add([]byte(`{"beamId":"a@beam.directory","capabilities":"nope","trustScore":"x"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var a Agent
		err := json.Unmarshal(data, &a)
		var obj map[string]json.RawMessage
		isObject := json.Unmarshal(data, &obj) == nil && obj != nil
		if err != nil {
			require.False(t, isObject, "an object is always read (bad members are skipped): %q", data)
			return
		}
		if !isObject {
			return // null leaves the record empty
		}
		require.JSONEq(t, string(data), string(a.Raw), "Raw is the object as received")
		// Round trip: the fields, written back in either naming style,
		// read back as the same record.
		for _, names := range [][]string{
			{"beamId", "displayName", "publicKey", "trustScore", "createdAt", "lastSeen"},
			{"beam_id", "display_name", "public_key", "trust_score", "created_at", "last_seen"},
		} {
			out, err := json.Marshal(map[string]any{
				names[0]: a.BeamID, "did": a.DID, names[1]: a.DisplayName, "capabilities": a.Capabilities,
				names[2]: a.PublicKey, "org": a.Org, names[3]: a.TrustScore, "verified": a.Verified,
				"visibility": a.Visibility, names[4]: a.CreatedAt, names[5]: a.LastSeen,
			})
			require.NoError(t, err)
			var b Agent
			require.NoError(t, json.Unmarshal(out, &b))
			b.Raw = nil
			a2 := a
			a2.Raw = nil
			require.Equal(t, a2, b, "round trip through %s", out)
		}
	})
}

// attestedEnvelope is what the directory delivers for an unsigned frame:
// signed by the attestation key priv, marked with the attestation member.
func attestedEnvelope(t *testing.T, priv ed25519.PrivateKey, from, to string, at time.Time) envelope {
	t.Helper()
	f := wire.NewIntentFrame(from, to, "agent.ping", json.RawMessage(`{"x":1}`), at)
	require.NoError(t, wire.AttestIntent(f, priv))
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	pub := priv.Public().(ed25519.PublicKey)
	return envelope{Type: "intent", Frame: raw, SenderPublicKey: wire.EncodePublicKey(pub),
		Attestation: &wire.Attestation{By: "acme.beam.directory", KeyID: wire.AttestationKeyID(pub), Auth: wire.AttestAPIKey}}
}

func TestVerifyIncomingAttested(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 30, 15, 0, 0, 0, time.UTC)
	c, _ := offlineClient(t, "bob@acme.beam.directory", now)
	dirPub, dirPriv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	_, otherPriv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	// The directory's published key, as AttestationKeys caches it.
	c.att.keys = map[string]ed25519.PublicKey{wire.AttestationKeyID(dirPub): dirPub}
	c.att.fetched = time.Now()

	env := attestedEnvelope(t, dirPriv, "alice@acme.beam.directory", "bob@acme.beam.directory", now)
	in, err := c.verifyIncoming(env)
	require.NoError(t, err)
	require.NotNil(t, in.Attested)
	require.Equal(t, "acme.beam.directory", in.Attested.By)
	require.Equal(t, wire.AttestAPIKey, in.Attested.Auth)
	require.True(t, dirPub.Equal(in.Attested.Key))
	require.Nil(t, in.SenderPublicKey)

	// A key the directory does not publish cannot attest, whatever the
	// message claims.
	forged := attestedEnvelope(t, otherPriv, "alice@acme.beam.directory", "bob@acme.beam.directory", now)
	_, err = c.verifyIncoming(forged)
	require.ErrorContains(t, err, "not published")
	forged.Attestation.KeyID = wire.AttestationKeyID(dirPub)
	_, err = c.verifyIncoming(forged)
	require.ErrorContains(t, err, "not the directory's attestation key")
	forged.SenderPublicKey = env.SenderPublicKey
	_, err = c.verifyIncoming(forged)
	require.ErrorIs(t, err, wire.ErrBadSignature)

	// An attested frame without its mark is not taken as the sender's.
	unmarked := env
	unmarked.Attestation = nil
	_, err = c.verifyIncoming(unmarked)
	require.ErrorContains(t, err, "not marked attested")

	// An unsigned frame is refused, even on a bus delivery.
	f := wire.NewIntentFrame("alice@acme.beam.directory", "bob@acme.beam.directory", "agent.ping", nil, now)
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	alice, err := GenerateIdentity("alice@acme.beam.directory")
	require.NoError(t, err)
	unsigned := envelope{Type: "intent", Frame: raw, SenderPublicKey: alice.PublicKeyBase64(),
		Bus: &busMark{DurableDelivery: DurableDelivery{MessageID: "m1", Attempt: 1, Auth: "api_key"}}}
	_, err = c.verifyIncoming(unsigned)
	require.ErrorIs(t, err, wire.ErrBadSignature)

	bad := env
	bad.Attestation = &wire.Attestation{By: "x", KeyID: wire.AttestationKeyID(dirPub), Auth: "trust-me"}
	_, err = c.verifyIncoming(bad)
	require.ErrorContains(t, err, "unknown auth")
}

// Intents that arrive together before the attestation key is cached all
// verify: the ones that find the first one's fetch under way wait for it,
// rather than taking the key for unpublished.
func TestConcurrentAttestedIntentsShareTheKeyFetch(t *testing.T) {
	t.Parallel()
	dirPub, _, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	keyID := wire.AttestationKeyID(dirPub)
	doc, err := json.Marshal(wire.AttestationKeys{By: "acme.beam.directory", Keys: []wire.AttestationKey{
		{KeyID: keyID, PublicKey: wire.EncodePublicKey(dirPub), Algorithm: "Ed25519"}}})
	require.NoError(t, err)
	const callers = 4
	arrived := make(chan struct{}, callers)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, wire.AttestationKeysPath, r.URL.Path)
		arrived <- struct{}{}
		<-release
		_, _ = w.Write(doc)
	}))
	t.Cleanup(srv.Close)
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // before srv.Close, which waits for the held request
	id, err := GenerateIdentity("bob@acme.beam.directory")
	require.NoError(t, err)
	c, err := NewClient(ClientConfig{DirectoryURL: srv.URL, Identity: id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	errs := make(chan error, callers)
	call := func() {
		_, err := c.attestationKey(context.Background(), keyID)
		errs <- err
	}
	go call()
	<-arrived // the first fetch is under way
	for range callers - 1 {
		go call()
	}
	require.Never(t, func() bool { return len(errs) > 0 }, 300*time.Millisecond, 10*time.Millisecond,
		"an intent arriving during the fetch waits for it")
	open()
	for range callers {
		require.NoError(t, <-errs)
	}
	require.Len(t, arrived, 0, "one fetch served them all")
}
