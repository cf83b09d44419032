package web

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// chromiumPath finds a Chromium or Chrome binary: $BEAM_CHROMIUM, then the
// usual names on PATH.
func chromiumPath() string {
	if p := os.Getenv("BEAM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser starts a headless Chromium for the test and returns its context.
func browser(t *testing.T) context.Context {
	t.Helper()
	exe := chromiumPath()
	if exe == "" {
		t.Skip("no chromium binary found (install chromium or set BEAM_CHROMIUM); browser tests skipped")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 960),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("mute-audio", true),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	// Start the browser now. The first call must not carry a timeout: its
	// context owns the browser.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")))
	return ctx
}

// run runs steps with a deadline.
func run(t *testing.T, ctx context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	require.NoError(t, chromedp.Do(c, steps...))
}

// value runs one action with a deadline and returns its value.
func value[T any](t *testing.T, ctx context.Context, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(c, a)
	require.NoError(t, err)
	return v
}

// eval evaluates a JavaScript expression (awaiting a promise) and returns
// its value.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	return value(t, ctx, 10*time.Second, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

type shooter struct {
	t   *testing.T
	dir string
}

func newShooter(t *testing.T) *shooter {
	dir := os.Getenv("BEAM_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return &shooter{t: t, dir: dir}
}

// shot writes a full-page PNG of the current view.
func (s *shooter) shot(ctx context.Context, name string) {
	s.t.Helper()
	buf := value(s.t, ctx, 20*time.Second, chromedp.FullScreenshot(100))
	require.NoError(s.t, os.WriteFile(filepath.Join(s.dir, name+".png"), buf, 0o644))
}

// waitJS waits until the JavaScript expression is truthy on the page.
func waitJS(t *testing.T, ctx context.Context, d time.Duration, expr string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := chromedp.Run(c, chromedp.Poll[bool]("!!("+expr+")", chromedp.WithPollingInterval(25*time.Millisecond), chromedp.WithPollingTimeout(d)))
	require.NoError(t, err, "condition never held: %s", expr)
}

func setTheme(t *testing.T, ctx context.Context, theme string) {
	t.Helper()
	run(t, ctx, 10*time.Second,
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[any](fmt.Sprintf(`localStorage.setItem("beam-theme", %q)`, theme)))
			return err
		}),
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))
}

func TestBrowserDashboard(t *testing.T) {
	b := setup(t)
	ctx := browser(t)
	shots := newShooter(t)

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
	run(t, ctx, 20*time.Second,
		chromedp.Navigate(b.url("/dashboard/")),
		chromedp.WaitVisible(chromedp.ID("token")))
	loc := value(t, ctx, 5*time.Second, chromedp.Location())
	require.True(t, strings.HasSuffix(loc, "/dashboard/login"), loc)
	status := eval[int](t, ctx, `fetch("/observability/overview").then(r => r.status)`)
	require.Equal(t, 401, status)
	shots.shot(ctx, "01-login-light")

	// A wrong token shows an error; the right one logs in.
	run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))

	// Overview.
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/overview")))
	waitJS(t, ctx, 10*time.Second, `!!document.querySelector("#m-total .value") && !document.querySelector("#m-total .value").classList.contains("skeleton")`)
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("svg.chart rect").length > 0`)
	shots.shot(ctx, "02-overview-light")

	// Intents: the live feed shows a newly sent intent within 2 s.
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 4`)
	waitJS(t, ctx, 10*time.Second, `document.getElementById("live").dataset.state === "live"`)
	nonce := b.sendEcho(alice, "conversation.message")
	sel := fmt.Sprintf(`#intent-rows tr[data-nonce=%q]`, nonce)
	waitJS(t, ctx, 2*time.Second, fmt.Sprintf(`!!document.querySelector(%q)`, sel))
	firstRow := eval[string](t, ctx, `document.querySelector("#intent-rows tr").dataset.nonce`)
	require.Equal(t, nonce, firstRow, "the new intent is at the top")
	shots.shot(ctx, "03-intents-light")

	// "/" focuses the search box.
	eval[any](t, ctx, `document.activeElement && document.activeElement.blur()`)
	run(t, ctx, 5*time.Second, chromedp.KeyEvent("/"))
	focused := eval[string](t, ctx, `document.activeElement.id`)
	require.Equal(t, "q", focused)

	// Clicking the row opens its trace: the lifecycle in order.
	run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(sel)), chromedp.WaitVisible(chromedp.ID("timeline")))
	states := eval[[]string](t, ctx, `[...document.querySelectorAll("#timeline > li")].map(li => li.dataset.state)`)
	require.Equal(t, []string{"received", "validated", "dispatched", "delivered", "acked"}, states)
	shownNonce := value(t, ctx, 5*time.Second, chromedp.Text(chromedp.ID("trace-nonce")))
	require.Equal(t, nonce, shownNonce)
	shots.shot(ctx, "04-trace-light")

	// Keyboard: Enter on a focused row opens the trace.
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 5`)
	run(t, ctx, 5*time.Second, chromedp.Focus(chromedp.CSS(`#intent-rows tr[data-nonce="n-failed-1"]`)), chromedp.KeyEvent("\r"))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#timeline > li").length === 4`)
	shots.shot(ctx, "05-trace-failed-light")

	// Dead letters, agents, federation as admin.
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	waitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	disabled := eval[bool](t, ctx, `document.querySelector("button[data-requeue]").disabled`)
	require.False(t, disabled, "an admin may requeue")
	run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`tr[data-id="msg-dead-1"] td:nth-child(2)`)))
	waitJS(t, ctx, 10*time.Second, `!!document.querySelector("#dl-detail pre.json")`)
	shots.shot(ctx, "06-dead-letters-admin-light")

	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/agents")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 2`)
	shots.shot(ctx, "07-agents-light")
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/federation")),
		chromedp.WaitVisible(chromedp.ID("federation-empty")))
	shots.shot(ctx, "08-federation-light")

	// Dark theme.
	setTheme(t, ctx, "dark")
	theme := eval[string](t, ctx, `document.documentElement.dataset.theme`)
	require.Equal(t, "dark", theme)
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/overview")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("svg.chart rect").length > 0`)
	shots.shot(ctx, "09-overview-dark")
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 5`)
	shots.shot(ctx, "10-intents-dark")
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents/"+nonce)), chromedp.WaitVisible(chromedp.ID("timeline")))
	shots.shot(ctx, "11-trace-dark")
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	waitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	shots.shot(ctx, "12-dead-letters-dark")
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/agents")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 2`)
	shots.shot(ctx, "13-agents-dark")

	// Sign out, then a viewer sees requeue disabled with the reason.
	run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`#logout-form button`)), chromedp.WaitVisible(chromedp.ID("token")))
	shots.shot(ctx, "14-login-dark")
	status = eval[int](t, ctx, `fetch("/observability/intents").then(r => r.status)`)
	require.Equal(t, 401, status)
	run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.ID("token"), viewerToken),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")),
		chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	waitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	disabled = eval[bool](t, ctx, `document.querySelector("button[data-requeue]").disabled`)
	require.True(t, disabled, "a viewer cannot requeue")
	reason := value(t, ctx, 5*time.Second, chromedp.Text(chromedp.ID("requeue-unavailable")))
	require.Contains(t, reason, "viewer")
	setTheme(t, ctx, "light")
	waitJS(t, ctx, 10*time.Second, `!!document.querySelector("button[data-requeue]")`)
	shots.shot(ctx, "15-dead-letters-viewer-light")

	// Still usable on a 1024 px wide screen.
	run(t, ctx, 10*time.Second, chromedp.EmulateViewport(1024, 768), chromedp.Navigate(b.url("/dashboard/#/overview")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("svg.chart rect").length > 0`)
	overflow := eval[bool](t, ctx, `document.documentElement.scrollWidth > window.innerWidth + 1`)
	require.False(t, overflow, "no horizontal scrolling at 1024 px")
	shots.shot(ctx, "16-overview-1024")
	run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	waitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length >= 5`)
	shots.shot(ctx, "17-intents-1024")
	t.Logf("screenshots in %s", shots.dir)
}
