package agents_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
)

// TestInteropTypeScriptSDK runs fixtures/interop-js/interop.mjs — the
// published beam-protocol-sdk 0.5.1 — against a real directory, together
// with a Go agent the script talks to (JS → Go) and that talks back to a JS
// agent from inside its handler (Go → JS). CI runs `npm ci` in
// fixtures/interop-js first.
func TestInteropTypeScriptSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH; the TypeScript SDK interop test needs Node.js 18+")
	}
	dir, err := filepath.Abs(filepath.Join("..", "fixtures", "interop-js"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "beam-protocol-sdk")); err != nil {
		t.Skipf("%s/node_modules is missing; run `npm ci` there first", dir)
	}
	// SDK 0.5.1 opens /ws?beamId=… without any proof of identity, which the
	// directory accepts only with AllowLegacyWSIdentity.
	b := startDirectory(t, beam.Config{AllowLegacyWSIdentity: true})

	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	gopherID := "gopher-" + hex.EncodeToString(suffix) + "@interop.beam.directory"
	gopher, _ := b.connected(t, gopherID)
	gopher.Handle(agents.IntentConversation, func(_ context.Context, in *agents.Intent) agents.Reply {
		var m struct {
			Message string `json:"message"`
		}
		if err := in.Bind(&m); err != nil {
			return agents.Failure("BAD_REQUEST", err.Error())
		}
		return agents.Success(map[string]string{"message": "Go heard: " + m.Message})
	})
	gopher.Handle("agent.introduce", func(ctx context.Context, in *agents.Intent) agents.Reply {
		var p struct {
			Peer string `json:"peer"`
		}
		if err := in.Bind(&p); err != nil || p.Peer == "" {
			return agents.Failure("BAD_REQUEST", "payload.peer is required")
		}
		reply, err := gopher.Talk(ctx, p.Peer, "hello from go")
		if err != nil {
			return agents.Failure("PEER_FAILED", err.Error())
		}
		return agents.Success(map[string]string{"peerReply": reply})
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := beamtest.NodeChecks(t, ctx, node, dir, "interop.mjs", "BEAM_URL="+b.url, "BEAM_GO_AGENT="+gopherID)
	require.GreaterOrEqual(t, n, 20)
}
