package directory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

// TestHandedHopIsDeliveredForItsOwner: a pipeline hop another node hands
// over is written to the actor's session with the owner's bus member and
// answered with the actor's result, and the holder records nothing of the
// owner's nonce — so the envelope's next hop to the same node, which
// carries the same nonce, is delivered too instead of being refused as a
// replay. A hop for an actor without a session here is answered OFFLINE,
// never handed on.
func TestHandedHopIsDeliveredForItsOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob, carol := b.register("alice"), b.register("bob"), b.register("carol")
	bc := b.connect(bob)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	hand := func(to string, attempt int) <-chan HandReply {
		f := b.unsignedFrame(alice, to, pipelineHopIntent, `{"id":"e1","creator":"`+alice.id+`"}`)
		f.Nonce = "mesh:e1"
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		out := make(chan HandReply, 1)
		go func() {
			out <- b.dir.RelayHandOver(ctx, HandOver{Frame: raw, Unsigned: true, TimeoutMs: 5000, FromNode: "node0",
				Hop: &HopMark{Author: alice.id, Auth: BusAuthAPIKey, MessageID: "e1", Attempt: attempt}})
		}()
		return out
	}
	for attempt := 1; attempt <= 2; attempt++ {
		rep := hand(bob.id, attempt)
		m := bc.nextOf("intent")
		require.Equal(t, "mesh:e1", intentFrame(t, m).Nonce)
		require.Contains(t, string(m.raw), `"bus":{"messageId":"e1","attempt":`)
		bc.respond(b.clock, "mesh:e1", true, `{"ok":true}`)
		r := <-rep
		require.Nil(t, r.Error, "hop %d", attempt)
		rf, err := wire.DecodeResultFrame(r.Result)
		require.NoError(t, err)
		require.True(t, rf.Success)
	}
	require.False(t, b.hasRow("mesh:e1"), "the holder recorded an event of the owner's nonce")

	r := <-hand(carol.id, 1)
	require.NotNil(t, r.Error)
	require.Equal(t, CodeOffline, r.Error.Code)
}
