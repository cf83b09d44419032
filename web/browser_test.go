package web

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

func setTheme(t *testing.T, ctx context.Context, theme string) {
	t.Helper()
	browsertest.Run(t, ctx, 10*time.Second,
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[any](fmt.Sprintf(`localStorage.setItem("beam-theme", %q)`, theme)))
			return err
		}),
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))
}

func TestBrowserDashboard(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "")

	// Real traffic: an agent, a dead letter, and a few intents over the relay.
	alice := b.register("alice")
	b.register("bob")
	b.appendDeadLetter("n-dead-1", "msg-dead-1", time.Now().Add(-3*time.Minute))
	for i := 0; i < 3; i++ {
		b.sendEcho(alice, "agent.ping")
	}
	b.appendFlow("n-failed-1", alice.id, "bob@acme.beam.directory", "task.run", time.Now().Add(-2*time.Minute), 30*time.Millisecond,
		tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Failed)

	// Logged out: the UI sends the browser to the login page, data is 401.
	browsertest.Run(t, ctx, 20*time.Second,
		chromedp.Navigate(b.url("/dashboard/")),
		chromedp.WaitVisible(chromedp.ID("token")))
	loc := browsertest.Value(t, ctx, 5*time.Second, chromedp.Location())
	require.True(t, strings.HasSuffix(loc, "/dashboard/login"), loc)
	status := browsertest.Eval[int](t, ctx, `fetch("/observability/overview").then(r => r.status)`)
	require.Equal(t, 401, status)
	shots.Shot(ctx, "01-login-light")

	// A wrong token shows an error; the right one logs in.
	browsertest.Run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	browsertest.Run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))

	// Overview.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/overview")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector("#m-total .value") && !document.querySelector("#m-total .value").classList.contains("skeleton")`)
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("svg.chart rect").length > 0`)
	shots.Shot(ctx, "02-overview-light")

	// Intents: the live feed shows a newly sent intent within 2 s.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 4`)
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.getElementById("live").dataset.state === "live"`)
	nonce := b.sendEcho(alice, "conversation.message")
	sel := fmt.Sprintf(`#intent-rows tr[data-nonce=%q]`, nonce)
	browsertest.WaitJS(t, ctx, 2*time.Second, fmt.Sprintf(`!!document.querySelector(%q)`, sel))
	firstRow := browsertest.Eval[string](t, ctx, `document.querySelector("#intent-rows tr").dataset.nonce`)
	require.Equal(t, nonce, firstRow, "the new intent is at the top")
	shots.Shot(ctx, "03-intents-light")

	// "/" focuses the search box.
	browsertest.Eval[any](t, ctx, `document.activeElement && document.activeElement.blur()`)
	browsertest.Run(t, ctx, 5*time.Second, chromedp.KeyEvent("/"))
	focused := browsertest.Eval[string](t, ctx, `document.activeElement.id`)
	require.Equal(t, "q", focused)

	// Clicking the row opens its trace: the lifecycle in order.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(sel)), chromedp.WaitVisible(chromedp.ID("timeline")))
	states := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll("#timeline > li")].map(li => li.dataset.state)`)
	require.Equal(t, []string{"received", "validated", "dispatched", "delivered", "acked"}, states)
	shownNonce := browsertest.Value(t, ctx, 5*time.Second, chromedp.Text(chromedp.ID("trace-nonce")))
	require.Equal(t, nonce, shownNonce)
	shots.Shot(ctx, "04-trace-light")

	// Keyboard: Enter on a focused row opens the trace.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 5`)
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Focus(chromedp.CSS(`#intent-rows tr[data-nonce="n-failed-1"]`)), chromedp.KeyEvent("\r"))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#timeline > li").length === 4`)
	shots.Shot(ctx, "05-trace-failed-light")

	// Dead letters, agents, federation as admin.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	disabled := browsertest.Eval[bool](t, ctx, `document.querySelector("button[data-requeue]").disabled`)
	require.False(t, disabled, "an admin may requeue")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`tr[data-id="msg-dead-1"] td:nth-child(3)`)))
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector("#dl-detail pre.json")`)
	shots.Shot(ctx, "06-dead-letters-admin-light")

	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/agents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 2`)
	shots.Shot(ctx, "07-agents-light")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/federation")),
		chromedp.WaitVisible(chromedp.ID("federation-empty")))
	shots.Shot(ctx, "08-federation-light")

	// Dark theme.
	setTheme(t, ctx, "dark")
	theme := browsertest.Eval[string](t, ctx, `document.documentElement.dataset.theme`)
	require.Equal(t, "dark", theme)
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/overview")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("svg.chart rect").length > 0`)
	shots.Shot(ctx, "09-overview-dark")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 5`)
	shots.Shot(ctx, "10-intents-dark")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents/"+nonce)), chromedp.WaitVisible(chromedp.ID("timeline")))
	shots.Shot(ctx, "11-trace-dark")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	shots.Shot(ctx, "12-dead-letters-dark")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/agents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 2`)
	shots.Shot(ctx, "13-agents-dark")

	// Sign out, then a viewer sees requeue disabled with the reason.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`#logout-form button`)), chromedp.WaitVisible(chromedp.ID("token")))
	shots.Shot(ctx, "14-login-dark")
	status = browsertest.Eval[int](t, ctx, `fetch("/observability/intents").then(r => r.status)`)
	require.Equal(t, 401, status)
	browsertest.Run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), viewerToken),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")),
		chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	disabled = browsertest.Eval[bool](t, ctx, `document.querySelector("button[data-requeue]").disabled`)
	require.True(t, disabled, "a viewer cannot requeue")
	reason := browsertest.Value(t, ctx, 5*time.Second, chromedp.Text(chromedp.ID("requeue-unavailable")))
	require.Contains(t, reason, "viewer")
	setTheme(t, ctx, "light")
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	shots.Shot(ctx, "15-dead-letters-viewer-light")

	// Still usable on a 1024 px wide screen.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(1024, 768), chromedp.Navigate(b.url("/dashboard/#/overview")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("svg.chart rect").length > 0`)
	overflow := browsertest.Eval[bool](t, ctx, `document.documentElement.scrollWidth > window.innerWidth + 1`)
	require.False(t, overflow, "no horizontal scrolling at 1024 px")
	shots.Shot(ctx, "16-overview-1024")
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 5`)
	shots.Shot(ctx, "17-intents-1024")
	t.Logf("screenshots in %s", shots.Dir())
}

// With no theme saved, the dashboard follows the system's colour scheme,
// and follows it when it changes: data-theme always holds the resolved
// theme, which is all the stylesheet keys its palette on.
func TestBrowserThemeFollowsSystem(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	scheme := func(value string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, target *chromedp.Target) error {
			_, err := cdp.Call(ctx, target, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: value}}})
			return err
		})
	}
	bg := `getComputedStyle(document.documentElement).getPropertyValue("--bg").trim()`
	browsertest.Run(t, ctx, 20*time.Second, scheme("dark"),
		chromedp.Navigate(b.url("/dashboard/login")), chromedp.WaitVisible(chromedp.ID("token")))
	require.Nil(t, browsertest.Eval[any](t, ctx, `localStorage.getItem("beam-theme")`))
	require.Equal(t, "dark", browsertest.Eval[string](t, ctx, `document.documentElement.dataset.theme`))
	require.Equal(t, "#0d1017", browsertest.Eval[string](t, ctx, bg))

	browsertest.Run(t, ctx, 10*time.Second, scheme("light"))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.documentElement.dataset.theme === "light"`)
	require.NotEqual(t, "#0d1017", browsertest.Eval[string](t, ctx, bg))

	// A saved choice wins over the system.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`[data-theme-toggle]`)))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.documentElement.dataset.theme === "dark"`)
	require.Equal(t, "dark", browsertest.Eval[string](t, ctx, `localStorage.getItem("beam-theme")`))
}
