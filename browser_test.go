package beam

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/apitest"
)

// These tests drive headless Chromium against the real composition: the
// relay, the message bus, federation and the dashboard behind one listener.

const (
	browserAdminToken  = "bop_browser-test-admin-token"
	browserViewerToken = "bvw_browser-test-viewer-token"
)

// quietLogger drops the server's and the agents' logs.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// liveServer is a running Server on a loopback port.
type liveServer struct {
	t   *testing.T
	srv *Server
	url string
}

// startLive starts the whole directory with cfg on 127.0.0.1:0 and stops it
// when the test ends (after the test's later cleanups: agents and browser).
func startLive(t *testing.T, cfg Config) *liveServer {
	t.Helper()
	cfg.DataDir = t.TempDir()
	cfg.AdminToken, cfg.ViewerToken = browserAdminToken, browserViewerToken
	cfg.Synchronous = "NORMAL"
	cfg.Logger = quietLogger()
	if cfg.DefaultPolicy == "" {
		cfg.DefaultPolicy = "allow"
	}
	if cfg.Limits == nil {
		cfg.Limits = &Limits{} // none, unless the test sets some
	}
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	return serveLive(t, s)
}

// serveLive serves s on 127.0.0.1:0 and shuts it down when the test ends.
func serveLive(t *testing.T, s *Server) *liveServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
		require.NoError(t, <-served)
	})
	return &liveServer{t: t, srv: s, url: "http://" + ln.Addr().String()}
}

// agent registers name@domain with the server and returns its client (not
// connected).
func (l *liveServer) agent(name, domain string) *agents.Client {
	l.t.Helper()
	id, err := agents.GenerateIdentity(name + "@" + domain)
	require.NoError(l.t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: l.url, Identity: id, Logger: quietLogger(),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	require.NoError(l.t, err)
	l.t.Cleanup(func() { _ = c.Close() })
	_, err = c.Register(context.Background(), name, []string{"test"})
	require.NoError(l.t, err)
	return c
}

// message reads a bus message by nonce from the log.
func (l *liveServer) message(nonce string) tracing.MessageRow {
	l.t.Helper()
	m, ok, err := l.srv.Log().Message(context.Background(), nonce)
	require.NoError(l.t, err)
	require.True(l.t, ok, "no bus message with nonce %s", nonce)
	return m
}

func (l *liveServer) states(nonce string) []tracing.State {
	l.t.Helper()
	return apitest.States(l.t, l.srv.Log(), nonce)
}

// login signs in to the dashboard of base with token.
func login(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	browsertest.Run(t, ctx, 20*time.Second,
		chromedp.Navigate(base+"/dashboard/login"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))
}

func logout(t *testing.T, ctx context.Context) {
	t.Helper()
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`#logout-form button`)), chromedp.WaitVisible(chromedp.ID("token")))
}

// TestBrowserRequeueDeadLetter: a durable message dead-letters against a
// failing recipient; a viewer cannot requeue it; an admin requeues it from
// the UI and the UI shows it acked once the recipient recovers.
func TestBrowserRequeueDeadLetter(t *testing.T) {
	browsertest.SkipWithoutChromium(t)
	l := startLive(t, Config{Bus: Bus{
		RetrySchedule: []time.Duration{50 * time.Millisecond},
		MaxAttempts:   2,
		TickInterval:  25 * time.Millisecond,
	}})
	shots := browsertest.NewShooter(t, "requeue")

	sender := l.agent("sender", "acme.beam.directory")
	worker := l.agent("worker", "acme.beam.directory")
	var healthy atomic.Bool
	var attempts atomic.Int32
	worker.Handle("task.run", func(ctx context.Context, in *agents.Intent) agents.Reply {
		attempts.Add(1)
		if healthy.Load() {
			return agents.Success(map[string]any{"done": true})
		}
		return agents.Failure("WORKER_UNAVAILABLE", "the worker is down for maintenance")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, worker.Connect(ctx))

	rec, err := sender.SendDurable(ctx, worker.BeamID(), "task.run", map[string]any{"job": 42}, nil)
	require.NoError(t, err)
	nonce, id := rec.Nonce, rec.MessageID
	require.NotEmpty(t, id)
	require.Eventually(t, func() bool { return l.message(nonce).Status == tracing.DeadLetter }, 20*time.Second, 20*time.Millisecond,
		"the message never dead-lettered")
	require.EqualValues(t, 2, attempts.Load(), "both attempts reached the worker")

	bctx := browsertest.Start(t)

	// Logged out: the login page, and 401 for data and for requeue.
	browsertest.Run(t, bctx, 20*time.Second, chromedp.Navigate(l.url+"/dashboard/"), chromedp.WaitVisible(chromedp.ID("token")))
	loc := browsertest.Value(t, bctx, 5*time.Second, chromedp.Location())
	require.True(t, strings.HasSuffix(loc, "/dashboard/login"), loc)
	require.Equal(t, 401, browsertest.Eval[int](t, bctx, `fetch("/observability/dead-letters").then(r => r.status)`))
	require.Equal(t, 401, browsertest.Eval[int](t, bctx, fmt.Sprintf(`fetch("/observability/dead-letters/%s/requeue", {method: "POST"}).then(r => r.status)`, id)))
	shots.Shot(bctx, "01-login")

	// A viewer sees the dead letter with requeue disabled, and the server
	// refuses the viewer's requeue even with a valid CSRF token.
	login(t, bctx, l.url, browserViewerToken)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(l.url+"/dashboard/#/dead-letters"))
	btn := fmt.Sprintf(`button[data-requeue=%q]`, id)
	browsertest.WaitJS(t, bctx, 10*time.Second, fmt.Sprintf(`document.querySelector(%q)`, btn))
	require.True(t, browsertest.Eval[bool](t, bctx, fmt.Sprintf(`document.querySelector(%q).disabled`, btn)), "a viewer cannot requeue")
	reason := browsertest.Value(t, bctx, 5*time.Second, chromedp.Text(chromedp.ID("requeue-unavailable")))
	require.Contains(t, reason, "viewer")
	shots.Shot(bctx, "02-dead-letters-viewer")
	post := fmt.Sprintf(`fetch("/observability/dead-letters/%s/requeue", {method: "POST",
		headers: {"X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content}})
		.then(async r => r.status + " " + (await r.json()).errorCode)`, id)
	require.Equal(t, "403 FORBIDDEN", browsertest.Eval[string](t, bctx, post))
	require.Equal(t, tracing.DeadLetter, l.message(nonce).Status, "the viewer's request changed nothing")
	logout(t, bctx)

	// The worker recovers; an admin requeues from the detail panel.
	healthy.Store(true)
	login(t, bctx, l.url, browserAdminToken)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(l.url+"/dashboard/#/dead-letters"))
	browsertest.WaitJS(t, bctx, 10*time.Second, fmt.Sprintf(`document.querySelector(%q)`, btn))
	require.False(t, browsertest.Eval[bool](t, bctx, fmt.Sprintf(`document.querySelector(%q).disabled`, btn)), "an admin may requeue")
	shots.Shot(bctx, "03-dead-letters-admin")
	browsertest.ClickJS(t, bctx, fmt.Sprintf(`tr[data-id=%q] td:nth-child(3)`, id))
	browsertest.WaitJS(t, bctx, 10*time.Second, `document.querySelector("#dl-status") && document.querySelector("#dl-status").dataset.status === "dead_letter"`)
	panelBtn := "#dl-detail " + btn
	browsertest.WaitJS(t, bctx, 10*time.Second, fmt.Sprintf(`document.querySelector(%q)`, panelBtn))
	shots.Shot(bctx, "04-dead-letter-detail")
	// The first click arms the button, the second confirms.
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Click(chromedp.CSS(panelBtn)))
	browsertest.WaitJS(t, bctx, 5*time.Second, fmt.Sprintf(`document.querySelector(%q).textContent === "Confirm"`, panelBtn))
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Click(chromedp.CSS(panelBtn)))
	browsertest.WaitJS(t, bctx, 15*time.Second, `document.querySelector("#dl-status") && document.querySelector("#dl-status").dataset.status === "acked"`)
	browsertest.WaitJS(t, bctx, 10*time.Second, `!document.querySelector("#content table.data tr[data-id]")`)
	shots.Shot(bctx, "05-requeued-acked")

	// The log agrees: acked after the requeue, with three attempts in all.
	m := l.message(nonce)
	require.Equal(t, tracing.Acked, m.Status)
	require.EqualValues(t, 3, attempts.Load())
	st := l.states(nonce)
	require.Contains(t, st, tracing.DeadLetter)
	require.Equal(t, tracing.Acked, st[len(st)-1])

	// The trace, opened from the panel, shows the whole story in log order.
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Click(chromedp.CSS(`#dl-detail a[href^="#/intents/"]`)), chromedp.WaitVisible(chromedp.ID("timeline")))
	shown := browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll("#timeline > li")].map(li => li.dataset.state)`)
	want := make([]string, len(st))
	for i, s := range st {
		want[i] = string(s)
	}
	require.Equal(t, want, shown)
	shots.Shot(bctx, "06-trace-requeued")
	t.Logf("screenshots in %s", shots.Dir())
}

// TestBrowserFederation: the Federation view of a federation-enabled
// directory, and the trace of an intent relayed to a pinned peer with its
// hop and peer link, on both sides.
func TestBrowserFederation(t *testing.T) {
	browsertest.SkipWithoutChromium(t)
	alpha := startLive(t, Config{Domain: "alpha.beam.directory", Federation: Federation{NATSListen: "127.0.0.1:0"}})
	beta := startLive(t, Config{Domain: "beta.beam.directory", Federation: Federation{NATSListen: "127.0.0.1:0"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, alpha.srv.Federation().AddPeer(ctx, beta.srv.Federation().Self()))
	require.NoError(t, beta.srv.Federation().AddPeer(ctx, alpha.srv.Federation().Self()))
	shots := browsertest.NewShooter(t, "federation")

	b := beta.agent("b", "beta.beam.directory")
	b.Handle("task.run", func(ctx context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]any{"from": in.From})
	})
	require.NoError(t, b.Connect(ctx))
	a := alpha.agent("a", "alpha.beam.directory")
	res, err := a.Send(ctx, b.BeamID(), "task.run", map[string]any{"n": 1})
	require.NoError(t, err)
	require.True(t, res.Success)

	bctx := browsertest.Start(t)
	login(t, bctx, alpha.url, browserAdminToken)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(alpha.url+"/dashboard/#/federation"))
	browsertest.WaitJS(t, bctx, 10*time.Second, `document.querySelector("#content") && document.querySelector("#content").textContent.includes("beta.beam.directory")`)
	require.False(t, browsertest.Eval[bool](t, bctx, `!!document.getElementById("federation-empty")`))
	shots.Shot(bctx, "01-federation-alpha")

	full := []string{"received", "validated", "dispatched", "delivered", "acked"}
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(alpha.url+"/dashboard/#/intents/"+res.Nonce), chromedp.WaitVisible(chromedp.ID("timeline")))
	// The origin's timeline also shows the outbox steps: dispatched
	// annotations (CLAIMED, and a retry if the first publish failed).
	shown := browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll("#timeline > li")].map(li => li.dataset.state)`)
	require.Greater(t, len(shown), len(full), "%v", shown)
	require.Equal(t, full[:3], shown[:3])
	require.Equal(t, full[3:], shown[len(shown)-2:])
	for _, st := range shown[3 : len(shown)-2] {
		require.Equal(t, "dispatched", st, "%v", shown)
	}
	require.Equal(t, 1, browsertest.Eval[int](t, bctx, `document.querySelectorAll('[data-peer-link="beta.beam.directory"]').length`))
	shots.Shot(bctx, "02-trace-alpha")

	login(t, bctx, beta.url, browserAdminToken)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(beta.url+"/dashboard/#/intents/"+res.Nonce), chromedp.WaitVisible(chromedp.ID("timeline")))
	require.Equal(t, full, browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll("#timeline > li")].map(li => li.dataset.state)`))
	require.Equal(t, 1, browsertest.Eval[int](t, bctx, `document.querySelectorAll('[data-peer-link="alpha.beam.directory"]').length`))
	shots.Shot(bctx, "03-trace-beta")
	t.Logf("screenshots in %s", shots.Dir())
}
