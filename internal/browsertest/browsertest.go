package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// chromiumPath finds a Chromium or Chrome binary: $BEAM_CHROMIUM, then the
// usual names on PATH. It returns "" when there is none.
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

// SkipWithoutChromium skips the test when no browser is installed; call it
// before starting anything the test would otherwise leave behind.
func SkipWithoutChromium(t testing.TB) {
	t.Helper()
	if chromiumPath() == "" {
		t.Skip("no chromium binary found (install chromium or set BEAM_CHROMIUM); browser tests skipped")
	}
}

// Start starts a headless Chromium for the test (skipping it when there is
// none) and returns the context that drives it; the browser is closed when
// the test ends.
func Start(t testing.TB) context.Context {
	t.Helper()
	SkipWithoutChromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath()),
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
	// The first call starts the browser; its context owns the browser, so
	// it carries no timeout.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")))
	return ctx
}

// Run runs steps within d.
func Run(t testing.TB, ctx context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	require.NoError(t, chromedp.Do(c, steps...))
}

// Value runs one action within d and returns its value.
func Value[T any](t testing.TB, ctx context.Context, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(c, a)
	require.NoError(t, err)
	return v
}

// Eval evaluates a JavaScript expression on the page (awaiting a promise)
// and returns its value.
func Eval[T any](t testing.TB, ctx context.Context, expr string) T {
	t.Helper()
	return Value(t, ctx, 10*time.Second, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

// WaitJS waits up to d until the JavaScript expression is truthy on the
// page.
func WaitJS(t testing.TB, ctx context.Context, d time.Duration, expr string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := chromedp.Run(c, chromedp.Poll[bool]("!!("+expr+")", chromedp.WithPollingInterval(25*time.Millisecond), chromedp.WithPollingTimeout(d)))
	if err != nil {
		require.NoError(t, err, "condition never held: %s\nthe page then:\n%s", expr, pageState(ctx))
	}
}

// ClickJS clicks the element matching the CSS selector from inside the
// page, in one task of its event loop: unlike a synthesized mouse press and
// release, the click cannot be split across a re-render that replaces the
// element in between. It fails when no element matches.
func ClickJS(t testing.TB, ctx context.Context, selector string) {
	t.Helper()
	expr := fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true; })()`, selector)
	require.True(t, Eval[bool](t, ctx, expr), "no element matches %s; the page:\n%s", selector, pageState(ctx))
}

// pageState describes the page for a failure message: its address and the
// start of its visible text.
func pageState(ctx context.Context) string {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	state, err := chromedp.Run(c, chromedp.Evaluate[string](`location.href + "\n" + (document.body ? document.body.innerText.slice(0, 3000) : "(no body)")`))
	if err != nil {
		return fmt.Sprintf("(the page could not be read: %v)", err)
	}
	return state
}

// Shooter writes full-page screenshots into $BEAM_SCREENSHOT_DIR/<sub> (a
// temporary directory when the variable is unset). Under -short with the
// variable unset it takes none: nobody would look at them, and a full-page
// PNG is the slowest step of a browser test.
type Shooter struct {
	t    testing.TB
	dir  string
	skip bool
}

// NewShooter returns a Shooter for the test.
func NewShooter(t testing.TB, sub string) *Shooter {
	t.Helper()
	dir := os.Getenv("BEAM_SCREENSHOT_DIR")
	if dir == "" && testing.Short() {
		return &Shooter{t: t, skip: true}
	}
	if dir == "" {
		dir = t.TempDir()
	} else if sub != "" {
		dir = filepath.Join(dir, sub)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return &Shooter{t: t, dir: dir}
}

// Shot writes a full-page PNG of the current view as name.png.
func (s *Shooter) Shot(ctx context.Context, name string) {
	s.t.Helper()
	if s.skip {
		return
	}
	buf := Value(s.t, ctx, 20*time.Second, chromedp.FullScreenshot(100))
	require.NoError(s.t, os.WriteFile(filepath.Join(s.dir, name+".png"), buf, 0o644))
}

// Dir is the directory the screenshots are written to.
func (s *Shooter) Dir() string { return s.dir }

// overflowJS lists the visible elements whose right edge passes the
// viewport, after clipping by any ancestor that hides or scrolls its
// overflow, plus every table container that would need a horizontal
// scrollbar and a document wider than the viewport. Code blocks (pre) may
// scroll; nothing else may.
const overflowJS = `(() => {
  const W = document.documentElement.clientWidth;
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (typeof el.className === "string" && el.className ? "." + el.className.trim().split(/\s+/).join(".") : "");
  const bad = [];
  for (const el of document.querySelectorAll("body *")) {
    const cs = getComputedStyle(el);
    if (cs.display === "none" || cs.visibility === "hidden" || el.closest("[hidden]")) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    let right = r.right;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o !== "visible") right = Math.min(right, a.getBoundingClientRect().right);
    }
    if (right > W + 0.5) bad.push(name(el) + " right=" + Math.round(right));
    if ((cs.overflowX === "auto" || cs.overflowX === "scroll") && el.tagName !== "PRE" && el.scrollWidth > el.clientWidth + 1) {
      bad.push(name(el) + " scrolls sideways: " + el.scrollWidth + " > " + el.clientWidth);
    }
  }
  if (document.documentElement.scrollWidth > W) bad.push("document is " + document.documentElement.scrollWidth + " px wide");
  return bad.slice(0, 15);
})()`

// RequireNoOverflow fails the test when an element of the current page
// reaches past the viewport's right edge (after clipping by its
// ancestors), a table container needs a horizontal scrollbar, or the
// document is wider than the viewport; what names the page in the message.
func RequireNoOverflow(t testing.TB, ctx context.Context, what string) {
	t.Helper()
	bad := Eval[[]string](t, ctx, overflowJS)
	require.Empty(t, bad, "%s: elements past the viewport's right edge", what)
}
