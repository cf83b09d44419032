package directory

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory/registry"
)

// collectingOwner is a nonce owner that keeps the written frames the
// directory hands it.
type collectingOwner struct {
	mu sync.Mutex
	ws []Written
}

func (o *collectingOwner) Delivered(ws []Written) error {
	o.mu.Lock()
	o.ws = append(o.ws, ws...)
	o.mu.Unlock()
	return nil
}

func (o *collectingOwner) written() []Written {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Written(nil), o.ws...)
}

// deliverWait runs Deliver and returns its outcome.
func deliverWait(t *testing.T, d *Directory, del Delivery) Outcome {
	t.Helper()
	ch := make(chan Outcome, 1)
	del.Done = func(o Outcome) { ch <- o }
	d.Deliver(context.Background(), del)
	select {
	case o := <-ch:
		return o
	case <-time.After(20 * time.Second):
		require.FailNow(t, "no outcome within 20s")
		return Outcome{}
	}
}

// setConfig PATCHes an agent's settings.
func (b *testBundle) setConfig(a *agent, body string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPatch, b.srv.URL+"/agents/"+a.id+"/config", bytes.NewReader([]byte(body)))
	require.NoError(b.t, err)
	req.Header.Set("x-api-key", a.apiKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	resp.Body.Close()
	require.Equal(b.t, http.StatusOK, resp.StatusCode)
}

// countingEndpoint is a direct-HTTP endpoint that answers {"ok":true} and
// counts its requests.
func countingEndpoint(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(ep.Close)
	return ep, &hits
}

// TestDeliverAppliesRecipientPolicyOnEveryPath: an owner's frame to a
// recipient whose policy refuses its author is refused with FORBIDDEN on
// the session path and on the direct-HTTP path alike; nothing reaches the
// recipient.
func TestDeliverAppliesRecipientPolicyOnEveryPath(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.policy = registry.PolicyDeny })
	alice, bob := b.register("alice"), b.register("bob")
	ep, hits := countingEndpoint(t)
	bc := b.connect(bob)
	owner := &collectingOwner{}

	for _, path := range []Path{pathSession, PathDirectHTTP} {
		f := b.unsignedFrame(alice, bob.id, "agent.ping", `{}`)
		o := deliverWait(t, b.dir, Delivery{Frame: f, Auth: BusAuthAPIKey, Path: path, Endpoint: ep.URL,
			MessageID: "m1", Attempt: 1, Owner: owner})
		require.NoError(t, o.Err)
		require.Equal(t, CodeForbidden, o.ErrorCode, "path %d", path)
		require.Contains(t, o.Error, "ACL denied")
		require.Nil(t, o.Result)
	}
	require.Zero(t, hits.Load())
	require.True(t, b.dir.NotifyAgent(bob.id, []byte(`{"type":"marker"}`)))
	require.Equal(t, "marker", bc.next().Type, "the refused frame reached the recipient")
	require.Empty(t, owner.written())
}

// TestDeliverRefusesAttestedPipelineHopsToSignatureRequiringActors: a
// pipeline hop (attested, never signed by an agent) to an actor that
// requires sender signatures is refused on the direct-HTTP path as on the
// session path, until the actor accepts attested pipeline hops.
func TestDeliverRefusesAttestedPipelineHopsToSignatureRequiringActors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ep, hits := countingEndpoint(t)
	b.setConfig(bob, `{"requireSenderSignatures":true}`)

	hop := func() Outcome {
		f := b.unsignedFrame(alice, bob.id, pipelineHopIntent, `{"id":"e1","creator":"`+alice.id+`"}`)
		return deliverWait(t, b.dir, Delivery{Frame: f, Auth: BusAuthAPIKey, Path: PathDirectHTTP, Endpoint: ep.URL})
	}
	o := hop()
	require.Equal(t, CodeSenderSignatureRequired, o.ErrorCode)
	require.Contains(t, o.Error, "acceptAttestedPipelineHops")
	require.Zero(t, hits.Load())

	b.setConfig(bob, `{"acceptAttestedPipelineHops":true}`)
	o = hop()
	require.Empty(t, o.ErrorCode, o.Error)
	require.NotNil(t, o.Result)
	require.True(t, o.Result.Success)
	require.Equal(t, int32(1), hits.Load())
}

// TestDeliverLeavesDeliveredToTheOwner: one writer per nonce. A frame an
// owner hands to a session is written to it and the owner is told
// (Owner.Delivered) so that it appends delivered; the directory appends
// nothing of the owner's nonce, and the outcome says delivered was
// recorded.
func TestDeliverLeavesDeliveredToTheOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)
	owner := &collectingOwner{}
	f := b.unsignedFrame(alice, bob.id, "agent.ping", `{}`)
	ch := make(chan Outcome, 1)
	b.dir.Deliver(context.Background(), Delivery{Frame: f, Auth: BusAuthAPIKey, MessageID: "m1", Attempt: 2,
		Owner: owner, Done: func(o Outcome) { ch <- o }})
	m := bc.nextOf("intent")
	require.Equal(t, f.Nonce, intentFrame(t, m).Nonce)
	require.Contains(t, string(m.raw), `"bus":{"messageId":"m1","attempt":2`)
	require.Eventually(t, func() bool { return len(owner.written()) == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, Written{Nonce: f.Nonce, From: alice.id, To: bob.id, Intent: "agent.ping", Attempt: 2, MessageID: "m1"},
		owner.written()[0])

	bc.respond(b.clock, f.Nonce, true, `{"ok":true}`)
	o := <-ch
	require.NoError(t, o.Err)
	require.NotNil(t, o.Result)
	require.True(t, o.Result.Success)
	require.True(t, o.Delivered)
	require.False(t, o.Written)
	require.False(t, b.hasRow(f.Nonce), "the directory recorded an event of the owner's nonce")
}
