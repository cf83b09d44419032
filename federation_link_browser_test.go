package beam

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/apitest"
	"github.com/beamdir/beam/internal/browsertest"
)

// TestBrowserFederationPeerDown: the Federation view shows a pinned peer's
// link as connected, and when the peer's process stops, turns it to down
// on its own, without a reload; a message waiting for it shows in the
// peer's outbox depth and last error.
func TestBrowserFederationPeerDown(t *testing.T) {
	browsertest.SkipWithoutChromium(t)
	alpha := startLive(t, Config{Domain: "alpha.beam.directory", Federation: Federation{NATSListen: "127.0.0.1:0"}})

	// beta runs here, not through startLive, so that the test can stop it.
	cfg := Config{Domain: "beta.beam.directory", Federation: Federation{NATSListen: "127.0.0.1:0"}, DataDir: t.TempDir(), Limits: &Limits{},
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
	a := apitest.Register(t, alpha.url, "a@alpha.beam.directory", "a", nil)
	_ = apitest.Register(t, "http://"+ln.Addr().String(), "b@beta.beam.directory", "b", nil)
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

	// A durable send to the stopped peer waits in the outbox: its row
	// shows the depth and the last publish error, live.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, alpha.url+"/v1/beam/send",
		strings.NewReader(`{"from":"a@alpha.beam.directory","to":"b@beta.beam.directory","intent":"task.run"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", a.APIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	browsertest.WaitJS(t, bctx, 30*time.Second, row+` && `+row+`.querySelector('[data-col="depth"]').textContent === "1" && `+
		row+`.querySelector('[data-col="lastError"]').textContent.includes("beta.beam.directory")`)
	require.Contains(t, browsertest.Eval[string](t, bctx, row+`.querySelector('[data-col="link"]').textContent`), "peer down, retrying")
	shots.Shot(bctx, "02b-backlog")
	for _, w := range []int64{390, 1440} {
		browsertest.Run(t, bctx, 5*time.Second, chromedp.EmulateViewport(w, 900))
		browsertest.WaitJS(t, bctx, 5*time.Second, row+` && `+row+`.dataset.link === "down"`)
		browsertest.RequireNoOverflow(t, bctx, fmt.Sprintf("federation at %d px", w))
		shots.Shot(bctx, fmt.Sprintf("03-peer-down-%d", w))
	}
	t.Logf("screenshots in %s", shots.Dir())
}
