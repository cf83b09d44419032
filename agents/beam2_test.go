package agents_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
)

func beam2(cfg *agents.ClientConfig) { cfg.Protocol = agents.ProtocolBeam2 }

func strict(cfg *agents.ClientConfig) { cfg.StrictProtocol = true }

func TestBeam2ClientsExchangeIntentsAndResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory", beam2)
	bob, bobID := b.connected(t, "bob@acme.beam.directory", beam2)

	got := make(chan *agents.Intent, 4)
	bob.Handle("agent.ping", func(_ context.Context, in *agents.Intent) agents.Reply {
		got <- in
		var p struct {
			N int `json:"n"`
		}
		if err := in.Bind(&p); err != nil {
			return agents.Failure("BAD_PAYLOAD", err.Error())
		}
		if p.N < 0 {
			return agents.Failure("NEGATIVE", "n must not be negative")
		}
		return agents.Success(map[string]any{"pong": p.N + 1})
	})

	// Over the WebSocket session.
	res, err := alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", map[string]any{"n": 41})
	require.NoError(t, err)
	require.True(t, res.Success)
	require.JSONEq(t, `{"pong":42}`, string(res.Payload))
	require.NoError(t, res.Verify(bobID.Public), "the frame inside the result JWS carries the beam/1 signature too")
	in := <-got
	require.Equal(t, agents.ProtocolBeam2, in.Protocol)
	require.NotEmpty(t, in.JWS)
	require.Empty(t, in.Frame.Signature, "beam/2 intents carry no beam/1 signature")
	require.Equal(t, res.Nonce, in.Nonce)

	// A failure reply comes back as a verified result with an *Error.
	res, err = alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", map[string]any{"n": -1})
	require.Equal(t, "NEGATIVE", agents.ErrorCode(err))
	require.NotNil(t, res)
	require.False(t, res.Success)
	<-got

	// Over HTTP (application/jose), from a client without a session.
	carol, _ := b.agent(t, "carol@acme.beam.directory", beam2)
	res, err = carol.Send(ctx, "bob@acme.beam.directory", "agent.ping", map[string]any{"n": 1})
	require.NoError(t, err)
	require.JSONEq(t, `{"pong":2}`, string(res.Payload))
	in = <-got
	require.Equal(t, "carol@acme.beam.directory", in.From)
	require.Equal(t, agents.ProtocolBeam2, in.Protocol)
}

func TestBeam2AndBeam1Clients(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory", beam2)
	strictAlice, _ := b.agent(t, "strict@acme.beam.directory", beam2, strict) // no session: HTTP
	bob, _ := b.connected(t, "bob@acme.beam.directory")                       // beam/1 only

	protocols := make(chan string, 4)
	bob.Handle("agent.ping", func(_ context.Context, in *agents.Intent) agents.Reply {
		protocols <- in.Protocol
		return agents.Success(map[string]any{"ok": true})
	})
	alice.Handle("agent.ping", func(_ context.Context, in *agents.Intent) agents.Reply {
		protocols <- in.Protocol
		return agents.Success(map[string]any{"ok": "beam2"})
	})

	// beam/2 → beam/1-only: the directory refuses the JWS; strict clients
	// get UNSUPPORTED_PROTOCOL, others fall back to a signed beam/1 frame.
	_, err := strictAlice.Send(ctx, "bob@acme.beam.directory", "agent.ping", nil)
	require.Equal(t, agents.CodeUnsupportedProtocol, agents.ErrorCode(err))
	require.Contains(t, err.Error(), "beam/1 only")
	require.Empty(t, protocols, "the refused intent never reached bob")

	res, err := alice.Send(ctx, "bob@acme.beam.directory", "agent.ping", nil)
	require.NoError(t, err)
	require.True(t, res.Success)
	require.Equal(t, agents.ProtocolBeam1, <-protocols)

	// beam/1 → beam/2: a beam/2 client takes beam/1 intents and answers in beam/1.
	res, err = bob.Send(ctx, "alice@acme.beam.directory", "agent.ping", nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"ok":"beam2"}`, string(res.Payload))
	require.Equal(t, agents.ProtocolBeam1, <-protocols)
}

func TestBeam2TalkToEcho(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	alice, _ := b.connected(t, "alice@acme.beam.directory", beam2)
	reply, err := alice.Talk(ctx, "echo@beam.directory", "hello over jws")
	require.NoError(t, err)
	require.Equal(t, "Echo: hello over jws", reply)

	// Without a session (HTTP, application/jose).
	bob, _ := b.agent(t, "bob@acme.beam.directory", beam2)
	reply, err = bob.Talk(ctx, "echo@beam.directory", "and over http")
	require.NoError(t, err)
	require.Equal(t, "Echo: and over http", reply)
}
