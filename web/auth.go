package web

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/limits"
)

// session is one logged-in browser.
type session struct {
	id      string
	role    string
	csrf    string
	created time.Time
	expires time.Time
}

func (s *session) checkCSRF(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// sessionStore keeps sessions in memory, bounded and expiring.
type sessionStore struct {
	mu  sync.Mutex
	m   map[string]*session
	ttl time.Duration
	max int
}

func newSessionStore(ttl time.Duration, max int) *sessionStore {
	return &sessionStore{m: map[string]*session{}, ttl: ttl, max: max}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}

// create starts a session for role.
func (st *sessionStore) create(role string, now time.Time) *session {
	s := &session{id: randomHex(32), role: role, csrf: randomHex(32), created: now, expires: now.Add(st.ttl)}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.m) >= st.max {
		var oldest *session
		for id, x := range st.m {
			if !now.Before(x.expires) {
				delete(st.m, id)
				continue
			}
			if oldest == nil || x.created.Before(oldest.created) {
				oldest = x
			}
		}
		if len(st.m) >= st.max && oldest != nil {
			delete(st.m, oldest.id)
		}
	}
	st.m[s.id] = s
	return s
}

// get returns the live session with id.
func (st *sessionStore) get(id string, now time.Time) (*session, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.m[id]
	if !ok {
		return nil, false
	}
	if !now.Before(s.expires) {
		delete(st.m, id)
		return nil, false
	}
	return s, true
}

func (st *sessionStore) remove(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.m, id)
}

// Failed-login rate limit: each client address may fail loginBurst times,
// then once per loginEvery.
const (
	loginBurst      = 5
	loginEvery      = 12 * time.Second
	maxLoginClients = 10_000
)

// newLoginLimiter returns the failed-login limit per client address, with
// a bounded table; when it is full, unknown clients share one bucket.
func newLoginLimiter(clock func() time.Time) *limits.Keyed {
	return limits.NewKeyedShared(limits.Rate{N: loginBurst, Per: loginBurst * loginEvery}, clock, maxLoginClients)
}

// clientAddr is the login limiter's key of r's address (an IPv6 address
// stands for its /64, see limits.HostKey).
func clientAddr(r *http.Request) string {
	return limits.HostKey(r.RemoteAddr)
}

// roleOf returns the role a token grants. Both tokens are always compared,
// in constant time over their digests.
func (d *Dashboard) roleOf(tok string) (string, bool) {
	if tok == "" || len(tok) > 4096 {
		return "", false
	}
	got := sha256.Sum256([]byte(tok))
	match := func(want string) bool {
		if want == "" {
			return false
		}
		w := sha256.Sum256([]byte(want))
		return subtle.ConstantTimeCompare(got[:], w[:]) == 1
	}
	admin, viewer := match(d.cfg.AdminToken), match(d.cfg.ViewerToken)
	switch {
	case admin:
		return roleAdmin, true
	case viewer:
		return roleViewer, true
	}
	return "", false
}

type loginPage struct {
	Error  string
	Notice string
}

func (d *Dashboard) renderLogin(w http.ResponseWriter, status int, pg loginPage) {
	setSecurityHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := d.pages.ExecuteTemplate(w, "login.html", pg); err != nil {
		d.lg.Warn("dashboard: render login", "err", err)
	}
}

func (d *Dashboard) handleLoginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := d.authenticate(r); ok {
		http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
		return
	}
	pg := loginPage{}
	if r.URL.Query().Get("signed_out") == "1" {
		pg.Notice = "You are signed out."
	}
	d.renderLogin(w, http.StatusOK, pg)
}

func (d *Dashboard) handleLogin(w http.ResponseWriter, r *http.Request) {
	now := d.clock()
	if err := sameOrigin(r); err != nil {
		d.renderLogin(w, http.StatusForbidden, loginPage{Error: "This sign-in form was submitted from another site."})
		return
	}
	client := clientAddr(r)
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		d.renderLogin(w, http.StatusBadRequest, loginPage{Error: "The form could not be read."})
		return
	}
	// The right token is always accepted: failed attempts from an address
	// (everyone behind one proxy shares it) must not lock its holder out.
	// Guessing is defeated by the tokens' length; the limit only slows and
	// flags a client that keeps failing.
	role, ok := d.roleOf(r.PostForm.Get("token"))
	if !ok && d.limiter.Blocked(client) {
		w.Header().Set("Retry-After", "15")
		d.renderLogin(w, http.StatusTooManyRequests, loginPage{Error: "Too many failed attempts. Wait a few seconds and try again."})
		return
	}
	if !ok {
		d.limiter.Allow(client) // takes one of the client's failures
		d.lg.Info("dashboard: failed login", "client", client)
		d.renderLogin(w, http.StatusUnauthorized, loginPage{Error: "That token is not valid for this directory."})
		return
	}
	s := d.sessions.create(role, now)
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    s.id,
		Path:     "/",
		Expires:  s.expires,
		MaxAge:   int(d.cfg.SessionTTL / time.Second),
		HttpOnly: true,
		Secure:   d.cfg.SecureCookies,
		SameSite: http.SameSiteStrictMode,
	})
	d.lg.Info("dashboard: login", "role", role, "client", client)
	http.Redirect(w, r, "/dashboard/", http.StatusSeeOther)
}

func (d *Dashboard) handleLogout(w http.ResponseWriter, r *http.Request, p principal) error {
	if p.session != nil {
		d.sessions.remove(p.session.id)
	}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: d.cfg.SecureCookies, SameSite: http.SameSiteStrictMode,
	})
	if r.Header.Get(csrfHeader) == "" { // a plain form post: navigate
		http.Redirect(w, r, "/dashboard/login?signed_out=1", http.StatusSeeOther)
		return nil
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"ok": true, "redirect": "/dashboard/login?signed_out=1"})
	return nil
}

// sessionView is GET /dashboard/session.
type sessionView struct {
	Role      string `json:"role"`
	CSRFToken string `json:"csrfToken"`
	ExpiresAt string `json:"expiresAt"`
	CanMutate bool   `json:"canMutate"`
}

func (d *Dashboard) handleSession(w http.ResponseWriter, r *http.Request, p principal) error {
	v := sessionView{Role: p.role, CanMutate: p.role == roleAdmin}
	if p.session != nil {
		v.CSRFToken = p.session.csrf
		v.ExpiresAt = p.session.expires.UTC().Format(time.RFC3339)
	}
	httpjson.Write(w, http.StatusOK, v)
	return nil
}
