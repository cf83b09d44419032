package web

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/testclock"
)

var jsonRoutes = []struct{ method, path string }{
	{"GET", "/observability/overview"},
	{"GET", "/observability/intents"},
	{"GET", "/observability/intents/some-nonce"},
	{"GET", "/observability/events/some-nonce"},
	{"GET", "/observability/errors"},
	{"GET", "/observability/agents"},
	{"GET", "/observability/dead-letters"},
	{"GET", "/observability/dead-letters/m1"},
	{"POST", "/observability/dead-letters/m1/requeue"},
	{"GET", "/observability/federation"},
	{"GET", "/observability/stream"},
	{"GET", "/observability/unknown"},
	{"GET", "/dashboard/session"},
	{"POST", "/dashboard/logout"},
	{"GET", "/dashboard/assets/app.js"},
	{"GET", "/dashboard/assets/chart.js"},
}

func TestAuthRequiredEverywhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client()
	for _, rt := range jsonRoutes {
		for _, auth := range []string{"", "Bearer wrong", "Basic abc"} {
			req := b.req(rt.method, rt.path, nil, "Accept", "application/json")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			r := do(t, c, req)
			require.Equal(t, http.StatusUnauthorized, r.status, "%s %s (%q): %s", rt.method, rt.path, auth, r.body)
			require.Equal(t, "UNAUTHORIZED", r.json(t)["errorCode"], "%s %s", rt.method, rt.path)
			require.NotEmpty(t, r.json(t)["error"])
		}
	}
	// A forged session cookie is no session.
	req := b.req("GET", "/observability/overview", nil)
	req.AddCookie(&http.Cookie{Name: sessionCookie, Value: strings.Repeat("ab", 32)})
	require.Equal(t, http.StatusUnauthorized, do(t, c, req).status)

	// HTML routes redirect to the login page.
	for _, p := range []string{"/dashboard/", "/dashboard/anything"} {
		r := do(t, c, b.req("GET", p, nil, "Accept", "text/html"))
		require.Equal(t, http.StatusSeeOther, r.status, p)
		require.Equal(t, "/dashboard/login", r.header.Get("Location"), p)
	}
	r := do(t, c, b.req("GET", "/dashboard", nil))
	require.Equal(t, http.StatusMovedPermanently, r.status)

	// The login page and what it needs are public.
	r = do(t, c, b.req("GET", "/dashboard/login", nil))
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, string(r.body), `name="token"`)
	require.Contains(t, r.header.Get("Content-Security-Policy"), "default-src 'self'")
	for _, a := range []string{"style.css", "theme.js", "favicon.svg"} {
		require.Equal(t, http.StatusOK, do(t, c, b.req("GET", "/dashboard/assets/"+a, nil)).status, a)
	}
	// Templates are not assets.
	op := b.login(adminToken)
	require.Equal(t, http.StatusNotFound, op.get("/dashboard/assets/index.html").status)
	require.Equal(t, http.StatusOK, op.get("/dashboard/assets/app.js").status)
}

func TestBearerTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusOK, b.get("/observability/overview", adminToken).status)
	require.Equal(t, http.StatusOK, b.get("/observability/overview", viewerToken).status)
	// Bearer tokens are for /observability only; the UI needs a session.
	r := do(t, b.client(), b.req("GET", "/dashboard/", nil, "Authorization", "Bearer "+adminToken))
	require.Equal(t, http.StatusSeeOther, r.status)
}

func TestLoginSetsHttpOnlyCookie(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client()
	form := url.Values{"token": {adminToken}}.Encode()
	r := do(t, c, b.req("POST", "/dashboard/login", strings.NewReader(form), "Content-Type", "application/x-www-form-urlencoded"))
	require.Equal(t, http.StatusSeeOther, r.status, string(r.body))
	cookies := (&http.Response{Header: r.header}).Cookies()
	require.Len(t, cookies, 1)
	ck := cookies[0]
	require.Equal(t, sessionCookie, ck.Name)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, "/", ck.Path)
	require.Len(t, ck.Value, 64)
	require.NotContains(t, ck.Value, adminToken)
	require.InDelta(t, defaultSessionTTL.Seconds(), float64(ck.MaxAge), 1)

	app := do(t, c, b.req("GET", "/dashboard/", nil, "Accept", "text/html"))
	require.Equal(t, http.StatusOK, app.status)
	require.Contains(t, string(app.body), `<meta name="csrf-token" content="`)
	require.Contains(t, string(app.body), `<meta name="beam-role" content="admin">`)

	// Logged in: the login page sends the browser on.
	require.Equal(t, http.StatusSeeOther, do(t, c, b.req("GET", "/dashboard/login", nil)).status)

	v := b.login(viewerToken)
	require.Equal(t, roleViewer, v.role)
}

func TestSecureCookieOption(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.SecureCookies = true } })
	form := url.Values{"token": {viewerToken}}.Encode()
	r := do(t, b.client(), b.req("POST", "/dashboard/login", strings.NewReader(form), "Content-Type", "application/x-www-form-urlencoded"))
	require.Equal(t, http.StatusSeeOther, r.status)
	require.True(t, (&http.Response{Header: r.header}).Cookies()[0].Secure)
}

func TestLoginFailuresAreRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client()
	post := func(tok string) reply {
		return do(t, c, b.req("POST", "/dashboard/login", strings.NewReader(url.Values{"token": {tok}}.Encode()),
			"Content-Type", "application/x-www-form-urlencoded"))
	}
	for i := 0; i < loginBurst; i++ {
		r := post("wrong")
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Contains(t, string(r.body), "not valid")
		require.Empty(t, r.header.Values("Set-Cookie"))
	}
	r := post("wrong")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	// Failed attempts from the address (say, others behind the same proxy)
	// do not lock out the holder of the right token.
	ok := post(adminToken)
	require.Equal(t, http.StatusSeeOther, ok.status, string(ok.body))
	require.NotEmpty(t, ok.header.Values("Set-Cookie"))
	require.Equal(t, http.StatusTooManyRequests, post("wrong-again").status, "wrong guesses stay limited")
}

func TestLoginRefusesCrossOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := do(t, b.client(), b.req("POST", "/dashboard/login", strings.NewReader(url.Values{"token": {adminToken}}.Encode()),
		"Content-Type", "application/x-www-form-urlencoded", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"))
	require.Equal(t, http.StatusForbidden, r.status)
	require.Empty(t, r.header.Values("Set-Cookie"))
}

func TestCSRFEnforcedOnMutations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendDeadLetter("n-dl", "m1", baseTime)
	op := b.login(adminToken)
	path := "/observability/dead-letters/m1/requeue"

	// No token, a wrong token, a token of another session.
	r := do(t, op.c, b.req("POST", path, nil, "Origin", b.srv.URL))
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, "CSRF_TOKEN_INVALID", r.json(t)["errorCode"])
	r = do(t, op.c, b.req("POST", path, nil, "Origin", b.srv.URL, csrfHeader, "nope"))
	require.Equal(t, http.StatusForbidden, r.status)
	other := b.login(adminToken)
	r = do(t, op.c, b.req("POST", path, nil, "Origin", b.srv.URL, csrfHeader, other.csrf))
	require.Equal(t, http.StatusForbidden, r.status)
	// The right token from another origin.
	r = do(t, op.c, b.req("POST", path, nil, "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site", csrfHeader, op.csrf))
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, "CROSS_ORIGIN", r.json(t)["errorCode"])
	b.mu.Lock()
	require.Empty(t, b.requeued)
	b.mu.Unlock()

	// Same origin with the session's token: the action runs.
	r = op.post(path)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.Equal(t, "queued", r.json(t)["status"])
	b.mu.Lock()
	require.Equal(t, []string{"m1"}, b.requeued)
	b.mu.Unlock()

	// Logout needs the token too.
	r = do(t, op.c, b.req("POST", "/dashboard/logout", nil, "Origin", b.srv.URL))
	require.Equal(t, http.StatusForbidden, r.status)
}

func TestViewerCannotRequeue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendDeadLetter("n-dl", "m1", baseTime)
	v := b.login(viewerToken)
	r := v.post("/observability/dead-letters/m1/requeue")
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, "FORBIDDEN", r.json(t)["errorCode"])

	req := b.req("POST", "/observability/dead-letters/m1/requeue", nil, "Authorization", "Bearer "+viewerToken)
	require.Equal(t, http.StatusForbidden, do(t, b.client(), req).status)

	var list deadLettersResponse
	v.get("/observability/dead-letters").decode(t, &list)
	require.True(t, list.Requeue.Available)
	require.False(t, list.Requeue.Allowed)
	require.Contains(t, list.Requeue.Reason, "viewer")
	b.mu.Lock()
	require.Empty(t, b.requeued)
	b.mu.Unlock()

	// A script with the admin token needs no CSRF token (no cookie).
	req = b.req("POST", "/observability/dead-letters/m1/requeue", nil, "Authorization", "Bearer "+adminToken)
	r = do(t, b.client(), req)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
}

func TestRequeueUnavailableWithoutBus(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.noBus = true })
	b.appendDeadLetter("n-dl", "m1", baseTime)
	op := b.login(adminToken)
	r := op.post("/observability/dead-letters/m1/requeue")
	require.Equal(t, http.StatusNotImplemented, r.status)
	require.Equal(t, "REQUEUE_UNAVAILABLE", r.json(t)["errorCode"])
	var list deadLettersResponse
	op.get("/observability/dead-letters").decode(t, &list)
	require.False(t, list.Requeue.Available)
	require.Contains(t, list.Requeue.Reason, "message bus")
	// Nothing changed in the log.
	m, ok, err := b.log.Message(t.Context(), "n-dl")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "dead_letter", string(m.Status))
}

func TestLogout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	op := b.login(adminToken)
	require.Equal(t, http.StatusOK, op.get("/observability/overview").status)
	r := op.post("/dashboard/logout")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.Equal(t, http.StatusUnauthorized, op.get("/observability/overview").status)
	require.Equal(t, http.StatusSeeOther, do(t, op.c, b.req("GET", "/dashboard/", nil)).status)
}

func TestSessionExpires(t *testing.T) {
	t.Parallel()
	clock := testclock.NewNow()
	b := setup(t, func(o *setupOpts) { o.clock = clock.Now })
	op := b.login(adminToken)
	require.Equal(t, http.StatusOK, op.get("/dashboard/session").status)
	clock.Advance(defaultSessionTTL + time.Second)
	require.Equal(t, http.StatusUnauthorized, op.get("/dashboard/session").status)
}

func TestWantsHTML(t *testing.T) {
	t.Parallel()
	r, _ := http.NewRequest("GET", "/", nil)
	require.False(t, WantsHTML(r))
	r.Header.Set("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8")
	require.True(t, WantsHTML(r))
	r.Header.Set("Accept", "application/json")
	require.False(t, WantsHTML(r))
	r.Header.Set("Accept", "text/html")
	r.Method = "POST"
	require.False(t, WantsHTML(r))
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := New(Config{Registry: b.reg, Directory: b.dir, AdminToken: "x"})
	require.Error(t, err)
	_, err = New(Config{Log: b.log, Registry: b.reg, Directory: b.dir})
	require.ErrorContains(t, err, "token")
	_, err = New(Config{Log: b.log, Registry: b.reg, Directory: b.dir, AdminToken: "same", ViewerToken: "same"})
	require.ErrorContains(t, err, "differ")
}
