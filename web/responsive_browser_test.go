package web

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

// retryTrace appends a bus message whose first attempt fails and waits
// 31 s for its retry, which then succeeds: received at 0, dispatched at
// 1 s, failed and requeued at 2 s, dispatched again at 33 s, delivered at
// 33.5 s, acked at 34 s. It returns the event offsets in milliseconds.
func (b *bundle) retryTrace(nonce string, at time.Time) []float64 {
	b.t.Helper()
	offs := []float64{0, 1000, 2000, 33000, 33500, 34000}
	t := func(i int) time.Time { return at.Add(time.Duration(offs[i]) * time.Millisecond) }
	evs := []tracing.Event{
		{Nonce: nonce, State: tracing.Received, At: t(0), From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
			IntentType: "report.build", Transport: "bus", Details: tracing.Details{Owner: tracing.OwnerBus,
				Bus: &tracing.BusMessage{MessageID: "msg-" + nonce, Payload: json.RawMessage(`{"job":"y"}`), MaxRetries: 5}}},
		{Nonce: nonce, State: tracing.Dispatched, At: t(1), Transport: "bus", Attempt: 1},
		{Nonce: nonce, State: tracing.Queued, At: t(2), Transport: "bus", Attempt: 1,
			Details: tracing.Details{ErrorCode: "OFFLINE", Error: "agent offline", Retryable: true, RetryCount: intPtr(1), NextRetryAt: t(3).UnixMilli()}},
		{Nonce: nonce, State: tracing.Dispatched, At: t(3), Transport: "bus", Attempt: 2},
		{Nonce: nonce, State: tracing.Delivered, At: t(4), Transport: "bus", Attempt: 2},
		{Nonce: nonce, State: tracing.Acked, At: t(5), Transport: "bus", Attempt: 2,
			Details: tracing.Details{Result: json.RawMessage(fmt.Sprintf(`{"v":"1","success":true,"nonce":%q,"payload":{"ok":true}}`, nonce))}},
	}
	_, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
	return offs
}

type barBox struct {
	Seq        string  `json:"seq"`
	Kind       string  `json:"kind"`
	Left       float64 `json:"left"`
	Width      float64 `json:"width"`
	TrackLeft  float64 `json:"trackLeft"`
	TrackWidth float64 `json:"trackWidth"`
}

// checkWaterfall compares the pixel position and width of every event's
// bar with the event times the test wrote.
func checkWaterfall(t *testing.T, ctx context.Context, offs []float64) {
	t.Helper()
	raw := browsertest.Eval[string](t, ctx, `JSON.stringify([...document.querySelectorAll("#waterfall .wf-stage")].map((row) => {
	  const track = row.querySelector(".wf-track").getBoundingClientRect();
	  const bar = row.querySelector(".wf-bar").getBoundingClientRect();
	  return { seq: row.dataset.seq, kind: row.dataset.kind, left: bar.left, width: bar.width, trackLeft: track.left, trackWidth: track.width };
	}))`)
	var bars []barBox
	require.NoError(t, json.Unmarshal([]byte(raw), &bars))
	require.Len(t, bars, len(offs), "one bar per event")
	total := offs[len(offs)-1]
	for i, b := range bars {
		require.Greater(t, b.TrackWidth, 50.0)
		px := b.TrackWidth / total // pixels per millisecond
		wantLeft := offs[i] * px
		require.InDelta(t, wantLeft, b.Left-b.TrackLeft, 1.5, "bar %d (%s) starts at %.0f ms", i, b.Kind, offs[i])
		if i+1 < len(offs) {
			wantWidth := (offs[i+1] - offs[i]) * px
			require.InDelta(t, math.Max(wantWidth, 2), b.Width, 1.5, "bar %d (%s) lasts %.0f ms", i, b.Kind, offs[i+1]-offs[i])
		}
	}
	// The retry wait is a failed attempt followed by a wait, 31 times as
	// long as the one-second dispatch before it.
	require.Equal(t, "retry", bars[2].Kind)
	require.InDelta(t, 31.0, bars[2].Width/bars[1].Width, 1.0)
	// The axis ticks sit where their labels say.
	ticks := browsertest.Eval[string](t, ctx, `JSON.stringify([...document.querySelectorAll("#waterfall .wf-tick")].map((e) => {
	  const tr = e.parentElement.getBoundingClientRect();
	  return [Number(e.dataset.ms), (e.getBoundingClientRect().left - tr.left) / tr.width];
	}))`)
	var tk [][2]float64
	require.NoError(t, json.Unmarshal([]byte(ticks), &tk))
	require.GreaterOrEqual(t, len(tk), 3, "the axis has a scale")
	for _, x := range tk {
		require.InDelta(t, x[0]/total, x[1], 0.01, "tick %v ms", x[0])
	}
}

func requireNoOverflow(t *testing.T, ctx context.Context, page string, width int) {
	t.Helper()
	browsertest.RequireNoOverflow(t, ctx, fmt.Sprintf("%s at %d px", page, width))
}

func TestBrowserResponsiveAndWaterfall(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "responsive")

	alice := b.register("alice")
	b.register("bob")
	b.appendDeadLetter("n-dead-1", "msg-dead-1", time.Now().Add(-3*time.Minute))
	for i := 0; i < 3; i++ {
		b.sendEcho(alice, "agent.ping")
	}
	offs := b.retryTrace("n-retry-1", time.Now().Add(-2*time.Minute))
	_, deadJob := b.shopJobs()
	b.appendEnvelope("env-r1", "procurement@demo.beam.directory", []string{"warehouse@demo.beam.directory", "finance@demo.beam.directory"}, time.Now().Add(-time.Minute))
	b.appendPeerOutage("n-outage-r1", 5, time.Now().Add(-time.Minute))

	for _, w := range []int{390, 1440} {
		browsertest.Run(t, ctx, 20*time.Second, chromedp.EmulateViewport(int64(w), 900),
			chromedp.Navigate(b.url("/dashboard/login")), chromedp.WaitVisible(chromedp.ID("token")))
		requireNoOverflow(t, ctx, "login", w)
		shots.Shot(ctx, fmt.Sprintf("%d-00-login", w))
	}
	browsertest.Run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))

	pages := []struct{ name, hash, ready string }{
		{"overview", "#/overview", `document.querySelectorAll("svg.chart rect").length > 0`},
		{"intents", "#/intents", `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 4`},
		{"trace", "#/intents/n-retry-1", `document.querySelectorAll("#waterfall .wf-stage").length === 6`},
		{"dead-letters", "#/dead-letters/msg-dead-1", `!!document.querySelector("#dl-detail pre.json")`},
		{"agents", "#/agents", `document.querySelectorAll("tbody tr.row-link").length === 2`},
		{"federation", "#/federation", `!!document.getElementById("federation-empty")`},
		{"jobs", "#/jobs", `document.querySelector('#jobs-queues tr[data-ns="shop"]') && document.querySelector('#jobs-dead-list tr[data-id="` + deadJob + `"]')`},
		{"pipelines", "#/pipelines", `!!document.querySelector('#mesh-table tr[data-id="env-r1"]')`},
		{"envelope", "#/pipelines/env-r1", `document.querySelectorAll("#mesh-hops li").length === 2 && document.querySelector("#mesh-waterfall .wf-stage")`},
		{"dead-letter-list", "#/dead-letters", `document.querySelectorAll("tr[data-id]").length > 0 || document.querySelectorAll("tbody tr").length > 0`},
		{"outage-trace", "#/intents/n-outage-r1", `!!document.querySelector("#timeline > li.tl-group")`},
	}
	for _, w := range []int{1440, 390} {
		browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(int64(w), 900))
		for i, p := range pages {
			browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/"+p.hash)))
			browsertest.WaitJS(t, ctx, 10*time.Second, p.ready)
			requireNoOverflow(t, ctx, p.name, w)
			shots.Shot(ctx, fmt.Sprintf("%d-%02d-%s", w, i+1, p.name))
			if p.name == "trace" {
				checkWaterfall(t, ctx, offs)
				// The failed attempt is not shown as a plain queued state.
				require.Equal(t, "failed · retry queued", browsertest.Eval[string](t, ctx,
					`document.querySelector('#timeline > li[data-state="queued"] .chip').textContent`))
			}
			if p.name == "overview" {
				// The data is minutes old: the window is 15 minutes, and the
				// traffic spreads over several bars, not one.
				require.Contains(t, browsertest.Eval[string](t, ctx, `document.getElementById("overview-window").textContent`), "15 minutes")
				bars := browsertest.Eval[int](t, ctx, `new Set([...document.querySelectorAll("svg.chart rect[class^='bar-']")].map((r) => r.getAttribute("x"))).size`)
				require.GreaterOrEqual(t, bars, 3, "traffic of three different minutes shows as separate bars")
				// Bus messages (34 s with a retry) are not mixed with the
				// direct echo intents (milliseconds).
				require.Equal(t, "directory", browsertest.Eval[string](t, ctx, `document.querySelectorAll("svg.chart")[1].dataset.owner`))
				p95 := browsertest.Eval[string](t, ctx, `document.querySelector("#m-p95 .value").textContent`)
				require.NotContains(t, p95, " s", "the direct p95 is in milliseconds, not the bus's seconds")
				require.Contains(t, browsertest.Eval[string](t, ctx, `document.querySelector("#m-p95 .hint").textContent`), "bus p95 34.00 s")
			}
			if p.name == "dead-letters" {
				require.Contains(t, browsertest.Eval[string](t, ctx, `document.getElementById("dl-error-code").textContent`), "OFFLINE")
			}
		}
		content := browsertest.Eval[float64](t, ctx, `document.getElementById("content").getBoundingClientRect().width`)
		if w == 1440 {
			require.Greater(t, content, 1150.0, "the wide layout uses the space")
		} else {
			require.LessOrEqual(t, content, float64(w))
		}
	}

	// The waterfall in the dark theme, at 1440 px.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(1440, 900))
	setTheme(t, ctx, "dark")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents/n-retry-1")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#waterfall .wf-stage").length === 6`)
	checkWaterfall(t, ctx, offs)
	shots.Shot(ctx, "1440-08-trace-dark")
	setTheme(t, ctx, "light")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(390, 900), chromedp.Navigate(b.url("/dashboard/#/agents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 2`)

	// At 390 px the navigation folds behind a menu button.
	navShown := `getComputedStyle(document.getElementById("nav")).display !== "none"`
	require.False(t, browsertest.Eval[bool](t, ctx, navShown), "the menu starts folded")
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.ID("nav-toggle")))
	browsertest.WaitJS(t, ctx, 5*time.Second, navShown)
	requireNoOverflow(t, ctx, "open menu", 390)
	shots.Shot(ctx, "390-07-menu")
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.CSS(`#nav a[data-view="agents"]`)))
	browsertest.WaitJS(t, ctx, 5*time.Second, `location.hash === "#/agents" && getComputedStyle(document.getElementById("nav")).display === "none"`)
	t.Logf("screenshots in %s", shots.Dir())
}
