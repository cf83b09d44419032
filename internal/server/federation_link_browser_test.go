package server

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/browsertest"
)

// TestBrowserFederationPeerDown: the Federation view shows a pinned peer's
// link as connected, and when the peer's process stops, turns it to down
// on its own, without a reload.
func TestBrowserFederationPeerDown(t *testing.T) {
	browsertest.SkipWithoutChromium(t)
	alpha := startLive(t, Config{Domain: "alpha.beam.directory", NATSListen: "127.0.0.1:0"})

	// beta runs here, not through startLive, so that the test can stop it.
	cfg := Config{Domain: "beta.beam.directory", NATSListen: "127.0.0.1:0", DataDir: t.TempDir(),
		AdminToken: browserAdminToken, ViewerToken: browserViewerToken, Synchronous: "NORMAL", Logger: quietLogger(), DefaultPolicy: "allow"}
	beta, err := New(context.Background(), cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- beta.Serve(ln) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, beta.Shutdown(ctx))
		require.NoError(t, <-served)
	}
	t.Cleanup(stop)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, alpha.srv.Federation().AddPeer(ctx, beta.Federation().Self()))
	require.NoError(t, beta.Federation().AddPeer(ctx, alpha.srv.Federation().Self()))
	shots := browsertest.NewShooter(t, "federation-link")

	bctx := browsertest.Start(t)
	login(t, bctx, alpha.url, browserAdminToken)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(alpha.url+"/dashboard/#/federation"))
	row := `document.querySelector('#federation-peers tr[data-peer="beta.beam.directory"]')`
	browsertest.WaitJS(t, bctx, 15*time.Second, row+` && `+row+`.dataset.link === "up"`)
	shots.Shot(bctx, "01-peer-up")

	stop()
	browsertest.WaitJS(t, bctx, 30*time.Second, row+` && `+row+`.dataset.link === "down"`)
	require.Contains(t, browsertest.Eval[string](t, bctx, row+`.textContent`), "disconnected")
	require.False(t, browsertest.Eval[bool](t, bctx, row+`.querySelector(".presence").classList.contains("link-up")`), "no green dot for a dead peer")
	require.False(t, browsertest.Eval[bool](t, bctx, `!!document.querySelector("#content .skeleton")`), "every card filled in")
	shots.Shot(bctx, "02-peer-down")
	for _, w := range []int64{390, 1440} {
		browsertest.Run(t, bctx, 5*time.Second, chromedp.EmulateViewport(w, 900))
		browsertest.WaitJS(t, bctx, 5*time.Second, row+` && `+row+`.dataset.link === "down"`)
		browsertest.RequireNoOverflow(t, bctx, fmt.Sprintf("federation at %d px", w))
		shots.Shot(bctx, fmt.Sprintf("03-peer-down-%d", w))
	}
	t.Logf("screenshots in %s", shots.Dir())
}
