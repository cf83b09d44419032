package jobs

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/tracing"
)

// Protocol limits (RFC §4.1, §15).
const (
	// maxBody is the largest request body accepted (8 KB).
	maxBody = 8192
	// maxPayload is the largest payload, result or KV value (7 KB of
	// compact JSON).
	maxPayload = 7168
	// defaultClaimTimeout is the lease of a claim.
	defaultClaimTimeout = 60 * time.Second
	// intentTTL is how long an intent may stay unclaimed.
	intentTTL = 24 * time.Hour
	// retention is how long fulfilled and dead intents are kept.
	retention = 7 * 24 * time.Hour
	// signatureWindow is the accepted distance of X-Timestamp from now.
	signatureWindow = 300 * time.Second
	// testerRateLimit is the requests per minute of a tester key.
	testerRateLimit = 60
	// testerOpenCap is the open+claimed intents a tester key may have.
	testerOpenCap = 2000
	// idempotencyTTL is how long an Idempotency-Key is remembered.
	idempotencyTTL = time.Hour
)

// Config configures the job bus. Log is required; the rest have defaults.
type Config struct {
	// Log is the event log the jobs live in.
	Log *tracing.Log
	// Secret is BUS_SECRET, the main API key (role admin). Required.
	Secret string
	// AdminSecret (BUS_ADMIN_SECRET) enables X-Admin-Token admin auth.
	AdminSecret string
	// DashboardPassword (DASHBOARD_PASSWORD) enables Basic admin:<pw>.
	DashboardPassword string
	// MetricsToken (BUS_METRICS_TOKEN) is the bearer token of /metrics.
	MetricsToken string
	// TrustProxy (BUS_TRUST_PROXY) trusts X-Forwarded-Proto/For.
	TrustProxy bool
	// EnforceHTTPS (BUS_ENFORCE_HTTPS) refuses plain HTTP except from
	// loopback.
	EnforceHTTPS bool
	// RequireSignatures (BUS_REQUIRE_SIGNATURES) refuses unsigned requests.
	RequireSignatures bool
	// Maintenance (BUS_MAINTENANCE_MODE) answers 503 to all but admin
	// routes, /health and /metrics.
	Maintenance bool
	// CleanupInterval (BUS_CLEANUP_INTERVAL_SECONDS, 300–86400, default
	// 21600) is the period of the retention pass.
	CleanupInterval time.Duration
	// ClaimTimeout is the lease of a claim (60 s, BEAM_INTENT_CLAIM_TIMEOUT).
	ClaimTimeout time.Duration
	// RateLimit is the requests per minute of a tester key (60,
	// BEAM_INTENT_RATE_LIMIT).
	RateLimit int
	// OpenCap is the open+claimed intents a tester key may have (2000,
	// BEAM_INTENT_OPEN_CAP).
	OpenCap int
	// ReapInterval is how often expired leases and due delays are acted on
	// (250 ms).
	ReapInterval time.Duration
	// Clock is the time source (time.Now).
	Clock func() time.Time
	// Rand is the source of ids, tokens and jitter (crypto/rand).
	Rand io.Reader
	// Logger receives operational logs (slog.Default()).
	Logger *slog.Logger
	// OnEvent, when set, is called after each committed job event (the
	// dashboard's live feed).
	OnEvent func(tracing.Event)
}

// ConfigFromEnv reads the BUS_* variables of RFC §14 through getenv.
// BUS_DB_PATH is not read: jobs live in beam's own log (--data-dir).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	var errs []error
	c.Secret = getenv("BUS_SECRET")
	c.AdminSecret = getenv("BUS_ADMIN_SECRET")
	c.DashboardPassword = getenv("DASHBOARD_PASSWORD")
	c.MetricsToken = getenv("BUS_METRICS_TOKEN")
	flag := func(name string) bool {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: not a boolean", name, v))
		}
		return b
	}
	c.TrustProxy = flag("BUS_TRUST_PROXY")
	c.EnforceHTTPS = flag("BUS_ENFORCE_HTTPS")
	c.RequireSignatures = flag("BUS_REQUIRE_SIGNATURES")
	c.Maintenance = flag("BUS_MAINTENANCE_MODE")
	if v := strings.TrimSpace(getenv("BUS_CLEANUP_INTERVAL_SECONDS")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 300 || n > 86400 {
			errs = append(errs, fmt.Errorf("BUS_CLEANUP_INTERVAL_SECONDS=%q: must be an integer from 300 to 86400", v))
		} else {
			c.CleanupInterval = time.Duration(n) * time.Second
		}
	}
	if v := strings.TrimSpace(getenv("BEAM_INTENT_CLAIM_TIMEOUT")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > time.Hour {
			errs = append(errs, fmt.Errorf("BEAM_INTENT_CLAIM_TIMEOUT=%q: must be a duration from 1s to 1h", v))
		}
		c.ClaimTimeout = d
	}
	posInt := func(name string) int {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: must be a positive integer", name, v))
		}
		return n
	}
	c.RateLimit = posInt("BEAM_INTENT_RATE_LIMIT")
	c.OpenCap = posInt("BEAM_INTENT_OPEN_CAP")
	return c, errors.Join(errs...)
}

func (c *Config) defaults() error {
	if c.Log == nil {
		return errors.New("jobs: Config.Log is required")
	}
	if c.Secret == "" {
		return errors.New("jobs: BUS_SECRET is required")
	}
	if c.Secret == "dev_secret" {
		return errors.New("jobs: BUS_SECRET must not be the default dev_secret")
	}
	if c.CleanupInterval == 0 {
		c.CleanupInterval = 6 * time.Hour
	}
	if c.ClaimTimeout == 0 {
		c.ClaimTimeout = defaultClaimTimeout
	}
	if c.RateLimit == 0 {
		c.RateLimit = testerRateLimit
	}
	if c.OpenCap == 0 {
		c.OpenCap = testerOpenCap
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = 250 * time.Millisecond
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
