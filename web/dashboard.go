package web

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/limits"
	"github.com/beamdir/beam/tracing"
)

//go:embed static
var staticFS embed.FS

// Defaults and bounds of the dashboard.
const (
	// defaultSessionTTL is how long a dashboard session lives.
	defaultSessionTTL = 12 * time.Hour
	// maxSessions bounds the in-memory session table; the oldest session is
	// dropped when it is full.
	maxSessions = 10_000
	// maxStreams bounds concurrent /observability/stream connections.
	maxStreams = 64
	// sessionCookie is the name of the session cookie.
	sessionCookie = "beam_dashboard"
	// csrfHeader carries the session's CSRF token on mutating requests.
	csrfHeader = "X-CSRF-Token"
)

// Roles of a dashboard principal.
const (
	// roleAdmin may read everything and run operator actions (requeue).
	roleAdmin = "admin"
	// roleViewer may read everything and change nothing.
	roleViewer = "viewer"
)

// Config configures a Dashboard. Log, Registry and Directory are required,
// and at least one of AdminToken and ViewerToken.
type Config struct {
	// Log is the event log the dashboard reads (never writes).
	Log *tracing.Log
	// Registry is the agent registry.
	Registry *registry.Registry
	// Directory answers which agents are connected.
	Directory *directory.Directory
	// AdminToken logs in as admin; empty disables admin logins.
	AdminToken string
	// ViewerToken logs in as viewer (read-only); empty disables it.
	ViewerToken string
	// Clock is the time source for sessions, windows and rate limits;
	// default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// Requeue moves a dead-lettered bus message back to queued. It is
	// provided by the message bus; nil means requeue is unavailable and the
	// UI says so.
	Requeue func(ctx context.Context, messageID string) error
	// MeshRequeue sends a dead pipeline envelope again and returns the new
	// envelope's id; nil means pipelines are not running.
	MeshRequeue func(ctx context.Context, id string) (string, error)
	// Federation returns the federation status (peers, outbox) to show; nil
	// means federation is not configured.
	Federation func(ctx context.Context) (any, error)
	// Cluster returns the cluster's nodes and where each agent is
	// connected (beam serve --cluster); nil means a single node.
	Cluster func(ctx context.Context) (any, error)
	// SecureCookies marks the session cookie Secure (serve over HTTPS).
	SecureCookies bool
	// SessionTTL overrides defaultSessionTTL.
	SessionTTL time.Duration
	// KeepAlive is the interval of SSE keepalive comments; default 15 s.
	KeepAlive time.Duration
}

// Dashboard serves the operator UI and its JSON/SSE endpoints.
type Dashboard struct {
	cfg      Config
	log      *tracing.Log
	reg      *registry.Registry
	dir      *directory.Directory
	clock    func() time.Time
	lg       *slog.Logger
	sessions *sessionStore
	limiter  *limits.Keyed
	assets   fs.FS
	pages    *template.Template

	jobsMu  sync.Mutex
	jobsSrc jobsView // the Intent Protocol job bus, nil until SetJobs

	streamMu     sync.Mutex
	streams      int
	streamBuffer int // tests lower it to provoke lag
}

// New validates cfg and returns a Dashboard. It starts no goroutine.
func New(cfg Config) (*Dashboard, error) {
	if cfg.Log == nil {
		return nil, errors.New("web: new dashboard: nil log")
	}
	if cfg.Registry == nil {
		return nil, errors.New("web: new dashboard: nil registry")
	}
	if cfg.Directory == nil {
		return nil, errors.New("web: new dashboard: nil directory")
	}
	if cfg.AdminToken == "" && cfg.ViewerToken == "" {
		return nil, errors.New("web: new dashboard: no admin or viewer token configured")
	}
	if cfg.AdminToken != "" && cfg.AdminToken == cfg.ViewerToken {
		return nil, errors.New("web: new dashboard: admin and viewer tokens must differ")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = defaultSessionTTL
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	assets, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("web: embedded assets: %w", err)
	}
	pages, err := template.ParseFS(staticFS, "static/index.html", "static/login.html")
	if err != nil {
		return nil, fmt.Errorf("web: parse page templates: %w", err)
	}
	return &Dashboard{
		cfg:      cfg,
		log:      cfg.Log,
		reg:      cfg.Registry,
		dir:      cfg.Directory,
		clock:    cfg.Clock,
		lg:       cfg.Logger,
		sessions: newSessionStore(cfg.SessionTTL, maxSessions),
		limiter:  newLoginLimiter(cfg.Clock),
		assets:   assets,
		pages:    pages,
	}, nil
}

// WantsHTML reports whether r is a browser navigation: a GET or HEAD whose
// Accept header lists text/html. The server uses it to send / to the
// dashboard.
func WantsHTML(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(mt), "text/html") {
			return true
		}
	}
	return false
}

// Routes registers the dashboard (/dashboard, /dashboard/...) and the
// observability endpoints (/observability/...) on mux.
func (d *Dashboard) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /dashboard/login", d.handleLoginPage)
	mux.HandleFunc("POST /dashboard/login", d.handleLogin)
	mux.Handle("POST /dashboard/logout", d.guard(kindJSON, false, d.handleLogout))
	mux.Handle("GET /dashboard/{$}", d.guard(kindHTML, false, d.handleApp))
	mux.Handle("GET /dashboard/session", d.guard(kindJSON, false, d.handleSession))
	mux.HandleFunc("GET /dashboard/assets/{file...}", d.api(d.handleAsset))
	mux.Handle("/dashboard/", d.guard(kindHTML, false, d.handleNotFound))

	obs := func(pattern string, admin bool, h handlerFunc) {
		mux.Handle(pattern, d.guard(kindJSON, admin, h))
	}
	obs("GET /observability/overview", false, d.handleOverview)
	obs("GET /observability/intents", false, d.handleIntents)
	obs("GET /observability/intents/{nonce}", false, d.handleTrace)
	obs("GET /observability/events/{nonce}", false, d.handleEvents)
	obs("GET /observability/errors", false, d.handleErrors)
	obs("GET /observability/agents", false, d.handleAgents)
	obs("GET /observability/dead-letters", false, d.handleDeadLetters)
	obs("GET /observability/dead-letters/{id}", false, d.handleDeadLetter)
	obs("POST /observability/dead-letters/{id}/requeue", true, d.handleRequeue)
	obs("GET /observability/federation", false, d.handleFederation)
	obs("GET /observability/cluster", false, d.handleCluster)
	obs("GET /observability/jobs", false, d.handleJobs)
	obs("POST /observability/jobs/{id}/retry", true, d.handleJobAction("retry"))
	obs("POST /observability/jobs/{id}/cancel", true, d.handleJobAction("cancel"))
	obs("GET /observability/stream", false, d.handleStream)
	d.meshRoutes(obs)
	obs("/observability/", false, d.handleNotFound)
}

// principal is who a request acts as.
type principal struct {
	role    string
	session *session // nil for bearer requests
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, p principal) error

type routeKind int

const (
	kindJSON routeKind = iota
	kindHTML
)

// guard authenticates a request (session cookie, or bearer token on
// /observability), enforces the same-origin check and the CSRF token on
// cookie-authenticated mutations, and the admin role where needed.
func (d *Dashboard) guard(kind routeKind, admin bool, h handlerFunc) http.Handler {
	return d.api(func(w http.ResponseWriter, r *http.Request) error {
		setSecurityHeaders(w)
		p, ok := d.authenticate(r)
		if !ok {
			if kind == kindHTML && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
				http.Redirect(w, r, "/dashboard/login", http.StatusSeeOther)
				return nil
			}
			return httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "log in to the dashboard or send Authorization: Bearer <token>")
		}
		if isMutation(r.Method) && p.session != nil {
			if err := sameOrigin(r); err != nil {
				return httpjson.New(http.StatusForbidden, "CROSS_ORIGIN", err.Error())
			}
			if !p.session.checkCSRF(csrfFrom(r)) {
				return httpjson.New(http.StatusForbidden, "CSRF_TOKEN_INVALID", "missing or invalid "+csrfHeader+" header")
			}
		}
		if admin && p.role != roleAdmin {
			return httpjson.New(http.StatusForbidden, "FORBIDDEN", "this action needs the admin role; viewers are read-only")
		}
		return h(w, r, p)
	})
}

// api serves h through the httpjson adapter: a returned *httpjson.Error
// is written in the Beam error shape, anything else is logged and answered
// 500 INTERNAL_ERROR.
func (d *Dashboard) api(h httpjson.HandlerFunc) http.HandlerFunc {
	return httpjson.Adapter{Log: d.lg}.Handler(h)
}

// authenticate returns the request's principal from the session cookie or,
// on /observability, from a bearer token.
func (d *Dashboard) authenticate(r *http.Request) (principal, bool) {
	if strings.HasPrefix(r.URL.Path, "/observability/") {
		if r.Header.Get("Authorization") != "" {
			tok, ok := httpjson.Bearer(r)
			if !ok {
				return principal{}, false
			}
			role, ok := d.roleOf(tok)
			return principal{role: role}, ok
		}
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return principal{}, false
	}
	s, ok := d.sessions.get(c.Value, d.clock())
	if !ok {
		return principal{}, false
	}
	return principal{role: s.role, session: s}, true
}

func isMutation(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

func csrfFrom(r *http.Request) string {
	if v := r.Header.Get(csrfHeader); v != "" {
		return v
	}
	// Plain HTML forms (logout without JavaScript) send it as a field.
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		r.Body = http.MaxBytesReader(nil, r.Body, 4<<10)
		return r.PostFormValue("csrf_token")
	}
	return ""
}

var crossOrigin = http.NewCrossOriginProtection()

// sameOrigin rejects a browser request whose Sec-Fetch-Site or Origin says
// it comes from another origin.
func sameOrigin(r *http.Request) error {
	if err := crossOrigin.Check(r); err != nil {
		return fmt.Errorf("cross-origin request refused: %w", err)
	}
	return nil
}

func setSecurityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
}

type appPage struct {
	Role      string
	CSRF      string
	CanMutate bool
}

func (d *Dashboard) handleApp(w http.ResponseWriter, r *http.Request, p principal) error {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := d.pages.ExecuteTemplate(w, "index.html", appPage{Role: p.role, CSRF: p.session.csrf, CanMutate: p.role == roleAdmin}); err != nil {
		d.lg.Warn("dashboard: render app", "err", err)
	}
	return nil
}

func (d *Dashboard) handleNotFound(w http.ResponseWriter, r *http.Request, _ principal) error {
	return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no such dashboard route: "+r.Method+" "+r.URL.Path)
}

// publicAssets may be fetched before login (the login page needs them).
var publicAssets = map[string]bool{"style.css": true, "theme.js": true, "login.js": true, "favicon.svg": true}

func (d *Dashboard) handleAsset(w http.ResponseWriter, r *http.Request) error {
	setSecurityHeaders(w)
	name := path.Clean(r.PathValue("file"))
	if !publicAssets[name] {
		if _, ok := d.authenticate(r); !ok {
			return httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "log in to the dashboard")
		}
	}
	if strings.HasSuffix(name, ".html") || strings.HasPrefix(name, ".") {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no such asset")
	}
	data, err := fs.ReadFile(d.assets, name)
	if err != nil {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no such asset")
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(data)
	return nil
}
