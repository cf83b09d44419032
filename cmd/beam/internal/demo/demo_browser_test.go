package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

const demoAdminToken = "bop_demo_browser_admin_token"

// demoServer is a directory with its job bus running the demo, as
// `beam serve --demo` starts it.
type demoServer struct {
	srv *beam.Server
	url string
}

func startDemo(t *testing.T) *demoServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := beam.New(ctx, beam.Config{DataDir: t.TempDir(), Synchronous: "NORMAL", AdminToken: demoAdminToken,
		JobBus: beam.JobBus{Enabled: true}, Limits: &beam.Limits{}, Logger: quiet})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	iln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	go func() { served <- srv.ServeJobBus(iln) }()
	secret, _ := srv.JobBusSecret()
	demoDone := make(chan error, 1)
	go func() {
		demoDone <- Run(ctx, Config{DirectoryURL: "http://" + ln.Addr().String(), StateDir: t.TempDir(), Interval: 300 * time.Millisecond,
			JobBusURL: "http://" + iln.Addr().String(), JobBusKey: secret, Logger: quiet})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-demoDone)
		sctx, c := context.WithTimeout(context.Background(), 20*time.Second)
		defer c()
		require.NoError(t, srv.Shutdown(sctx))
	})
	return &demoServer{srv: srv, url: "http://" + ln.Addr().String()}
}

// TestBrowserDemoFillsJobsAndPipelines: with --demo the Jobs page shows
// jobs of every status and the Pipelines page envelopes that succeeded and
// failed, each with its route, creator and creation time; an envelope's
// waterfall names the actor of each row and its hops their times. Every
// page of the dashboard fits a 390 px phone without scrolling sideways,
// and table rows there label their values.
func TestBrowserDemoFillsJobsAndPipelines(t *testing.T) {
	browsertest.SkipWithoutChromium(t)
	d := startDemo(t)
	ctx := context.Background()

	// The demo's jobs and orders reach every status they are meant to.
	bus := d.srv.JobBus()
	require.Eventually(t, func() bool {
		c := bus.Counts()[jobNamespace]
		return c[tracing.JobOpen]+c[tracing.JobClaimed] > 0 && c[tracing.JobFulfilled] >= 3 && c[tracing.JobDead] >= 1
	}, 60*time.Second, 50*time.Millisecond, "demo jobs of every status")
	var ok, failed tracing.MeshRow
	require.Eventually(t, func() bool {
		done, _, err := d.srv.Log().MeshEnvelopes(ctx, tracing.MeshQuery{Statuses: []tracing.MeshStatus{tracing.MeshSucceeded}, Limit: 1})
		require.NoError(t, err)
		bad, _, err := d.srv.Log().MeshEnvelopes(ctx, tracing.MeshQuery{Statuses: []tracing.MeshStatus{tracing.MeshFailed}, Limit: 1})
		require.NoError(t, err)
		if len(done) == 0 || len(bad) == 0 {
			return false
		}
		ok, failed = done[0], bad[0]
		return true
	}, 60*time.Second, 50*time.Millisecond, "demo pipelines that succeeded and failed")
	require.Equal(t, procurement, ok.Creator)

	bctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "demo")
	browsertest.Run(t, bctx, 20*time.Second, chromedp.EmulateViewport(1440, 900),
		chromedp.Navigate(d.url+"/dashboard/login"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), demoAdminToken), chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))

	rowWith := func(id string) string { return fmt.Sprintf(`document.querySelector('#mesh-table tr[data-id=%q]')`, id) }
	pages := []struct{ name, hash, ready string }{
		{"overview", "#/overview", `document.querySelectorAll("svg.chart rect").length > 0`},
		{"intents", "#/intents", `document.querySelectorAll("#intent-rows tr[data-nonce]").length > 0`},
		{"dead-letters", "#/dead-letters", `!document.querySelector(".skeleton")`},
		{"jobs", "#/jobs", `document.querySelector('#jobs-queues tr[data-ns="shop"]') && document.querySelectorAll('#jobs-recent tbody tr[data-id]').length >= 5 &&
			document.querySelectorAll('#jobs-dead-list tbody tr[data-id]').length >= 1`},
		{"pipelines", "#/pipelines", rowWith(ok.ID) + " && " + rowWith(failed.ID)},
		{"envelope", "#/pipelines/" + ok.ID, `document.querySelectorAll("#mesh-hops li").length === 3 && document.querySelectorAll("#mesh-waterfall .wf-stage[data-actor]").length > 0`},
		{"job-trace", "#/intents/job:" + bus.Recent(1, true)[0].ID, `document.querySelectorAll("#waterfall .wf-stage").length > 0`},
		{"agents", "#/agents", `document.querySelectorAll("tbody tr.row-link").length >= 5`},
		{"federation", "#/federation", `!!document.getElementById("federation-empty")`},
	}
	for _, w := range []int{1440, 390} {
		browsertest.Run(t, bctx, 10*time.Second, chromedp.EmulateViewport(int64(w), 900))
		for i, p := range pages {
			browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(d.url+"/dashboard/"+p.hash))
			browsertest.WaitJS(t, bctx, 20*time.Second, p.ready)
			browsertest.RequireNoOverflow(t, bctx, fmt.Sprintf("%s at %d px", p.name, w))
			shots.Shot(bctx, fmt.Sprintf("%d-%02d-%s", w, i+1, p.name))
			switch {
			case p.name == "pipelines" && w == 1440:
				// Route, creator and creation time of every envelope.
				require.Equal(t, []string{"Envelope", "Status", "Progress", "Route", "Creator", "Created", "Reason"},
					browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll("#mesh-table thead th")].map((th) => th.textContent)`))
				cells := browsertest.Eval[[]string](t, bctx, rowWith(ok.ID)+`.innerText.split("\t").map((s) => s.trim())`)
				require.Len(t, cells, 7)
				require.Equal(t, "warehouse → finance → partner-desk", cells[3])
				require.Equal(t, "procurement", cells[4])
				require.Regexp(t, `ago|just now`, cells[5])
			case p.name == "envelope":
				// Every hop says when it ran; the waterfall says whose each row is.
				times := browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll("#mesh-hops .hop-time")].map((e) => e.textContent)`)
				require.Len(t, times, 3)
				for _, s := range times {
					require.Regexp(t, `^started \d\d:\d\d:\d\d\.\d{3} · took `, s)
				}
				actors := browsertest.Eval[[]string](t, bctx, `[...new Set([...document.querySelectorAll("#mesh-waterfall .wf-stage")].map((r) => r.dataset.actor))]`)
				require.Subset(t, actors, []string{procurement, warehouse, finance, partnerDesk})
				require.Equal(t, "finance", browsertest.Eval[string](t, bctx,
					`document.querySelector('#mesh-waterfall .wf-stage[data-state="dispatched"][data-actor="`+finance+`"] .wf-actor').textContent`))
			case p.name == "jobs" && w == 390:
				// The header is hidden on a phone: every number says what it counts.
				labels := browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll('#jobs-queues tr[data-ns="shop"] td.num')].map((td) => getComputedStyle(td, "::before").content)`)
				require.Equal(t, []string{`"Open"`, `"Claimed"`, `"Fulfilled"`, `"Dead"`}, labels)
			case p.name == "pipelines" && w == 390:
				labels := browsertest.Eval[[]string](t, bctx, rowWith(ok.ID)+`.querySelectorAll("td").length && [...`+rowWith(ok.ID)+`.querySelectorAll("td")].slice(1).map((td) => getComputedStyle(td, "::before").content)`)
				require.Equal(t, []string{`"Status"`, `"Progress"`, `"Route"`, `"Creator"`, `"Created"`, `"Reason"`}, labels)
			}
		}
	}
	t.Logf("screenshots in %s", shots.Dir())
}
