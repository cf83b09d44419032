package agents

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/attempt"
)

// Protocol names a Beam wire protocol.
const (
	// ProtocolBeam1 is the JavaScript-compatible protocol of
	// beam-protocol-sdk: Ed25519 signatures over fixed JSON signing strings.
	ProtocolBeam1 = "beam/1"
	// ProtocolBeam2 is the compact-JWS protocol: intents and results travel
	// as EdDSA JWS whose kid is the signer's Beam ID.
	ProtocolBeam2 = "beam/2"
)

// Defaults of ClientConfig.
const (
	// DefaultReconnectMin is the first wait before reconnecting.
	DefaultReconnectMin = 500 * time.Millisecond
	// DefaultReconnectMax caps the wait between reconnection attempts.
	DefaultReconnectMax = 30 * time.Second
	// DefaultSendTimeout bounds a Send whose context has no deadline.
	DefaultSendTimeout = 65 * time.Second
	// DefaultHandlerTimeout bounds a handler's context.
	DefaultHandlerTimeout = 30 * time.Second
	// DefaultPingInterval is the WebSocket keepalive period.
	DefaultPingInterval = 25 * time.Second
	// DefaultMaxHandlers bounds concurrently running handlers.
	DefaultMaxHandlers = 64
)

// ClientConfig configures a Client. DirectoryURL and Identity are required;
// every other zero value means the documented default.
type ClientConfig struct {
	// DirectoryURL is the directory's base URL, e.g. "http://127.0.0.1:3100".
	DirectoryURL string
	// Identity is the agent the client acts as.
	Identity *Identity
	// APIKey, when set, authenticates the WebSocket session and agent
	// mutations. When empty, Identity.APIKey is used; when that is empty too,
	// the session is proven with a signature instead.
	APIKey string
	// Protocol is ProtocolBeam1 (default) or ProtocolBeam2. With beam/2 the
	// client signs its intents and results as JWS and announces beam/2 when
	// it connects; it still accepts beam/1 intents (and answers them in
	// beam/1).
	Protocol string
	// StrictProtocol, with ProtocolBeam2, turns off the fallback to beam/1:
	// by default an intent the directory refuses with UNSUPPORTED_PROTOCOL
	// (the recipient speaks beam/1 only) is sent again as a signed beam/1
	// frame with a new nonce.
	StrictProtocol bool
	// HTTPClient performs every request and the WebSocket handshake; default
	// a client with no overall timeout (requests are bounded by their
	// contexts).
	HTTPClient *http.Client
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// Clock is the time source for frame timestamps, the replay window of
	// incoming intents and latencies; default time.Now.
	Clock func() time.Time
	// ReconnectMin and ReconnectMax bound the exponential backoff (with
	// jitter) between reconnection attempts; defaults 500 ms and 30 s.
	ReconnectMin, ReconnectMax time.Duration
	// SendTimeout bounds a Send whose context has no deadline; default 65 s
	// (the directory answers with TIMEOUT after at most 60 s).
	SendTimeout time.Duration
	// HandlerTimeout bounds the context a handler runs with; default 30 s,
	// the directory's wait for WebSocket results.
	HandlerTimeout time.Duration
	// MaxConcurrentHandlers bounds how many handlers run at once; an intent
	// beyond it is answered with the failure code AGENT_BUSY. Default 64.
	MaxConcurrentHandlers int
	// PingInterval is how often the client pings the directory to detect a
	// dead session; default 25 s.
	PingInterval time.Duration
}

// Client is a Beam agent's connection to a directory. Its methods are safe
// for concurrent use. Create it with NewClient and release it with Close.
type Client struct {
	cfg   ClientConfig
	id    *Identity
	base  string // directory URL without trailing slash
	wsURL string // ws(s)://host/ws
	http  *http.Client
	log   *slog.Logger
	clock func() time.Time
	sem   chan struct{}

	ctx    context.Context // lifetime; canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	connectMu sync.Mutex // serializes Connect

	mu       sync.Mutex
	apiKey   string
	handlers map[string]Handler
	conn     *websocket.Conn // live session, nil while disconnected
	pending  map[string]*pendingSend
	started  bool // the session loop runs
	closed   bool

	durableHook func(DurableOutcome) // guarded by mu; OnDurableOutcome (durable.go)

	b2  beam2State  // beam/2 result keys (beam2.go)
	att attestState // the directory's attestation keys (attest.go)
}

// NewClient checks cfg and returns a client. It does no I/O.
func NewClient(cfg ClientConfig) (*Client, error) {
	switch cfg.Protocol {
	case "", ProtocolBeam1:
		cfg.Protocol = ProtocolBeam1
	case ProtocolBeam2:
	default:
		return nil, fmt.Errorf("new client: protocol %q: %w (want %s or %s)", cfg.Protocol, ErrProtocolUnsupported, ProtocolBeam1, ProtocolBeam2)
	}
	if err := cfg.Identity.validate(); err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	u, err := url.Parse(strings.TrimRight(cfg.DirectoryURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("new client: directory url: %w", err)
	}
	ws := *u
	switch u.Scheme {
	case "http":
		ws.Scheme = "ws"
	case "https":
		ws.Scheme = "wss"
	default:
		return nil, fmt.Errorf("new client: directory url %q: scheme must be http or https", cfg.DirectoryURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("new client: directory url %q has no host", cfg.DirectoryURL)
	}
	ws.Path = strings.TrimRight(u.Path, "/") + "/ws"
	ws.RawQuery, ws.Fragment = "", ""

	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax <= 0 {
		cfg.ReconnectMax = DefaultReconnectMax
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = cfg.ReconnectMin
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout
	}
	if cfg.HandlerTimeout <= 0 {
		cfg.HandlerTimeout = DefaultHandlerTimeout
	}
	if cfg.MaxConcurrentHandlers <= 0 {
		cfg.MaxConcurrentHandlers = DefaultMaxHandlers
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	apiKey := cfg.APIKey
	if apiKey == "" {
		apiKey = cfg.Identity.APIKey
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		cfg:      cfg,
		id:       cfg.Identity,
		base:     strings.TrimRight(u.String(), "/"),
		wsURL:    ws.String(),
		http:     cfg.HTTPClient,
		log:      cfg.Logger.With("beamId", cfg.Identity.BeamID),
		clock:    cfg.Clock,
		sem:      make(chan struct{}, cfg.MaxConcurrentHandlers),
		ctx:      ctx,
		cancel:   cancel,
		apiKey:   apiKey,
		handlers: map[string]Handler{},
		pending:  map[string]*pendingSend{},
	}, nil
}

// BeamID returns the Beam ID the client acts as.
func (c *Client) BeamID() string { return c.id.BeamID }

// APIKey returns the API key the client uses, if any (configured, or
// adopted from Register).
func (c *Client) APIKey() string { return c.apiKeyValue() }

func (c *Client) apiKeyValue() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiKey
}

// alive returns ErrClosed after Close.
func (c *Client) alive() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

// Connected reports whether the WebSocket session is up right now.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil
}

// Close ends the session, stops reconnecting, fails pending sends with
// ErrClosed and waits for running handlers to return. It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conn := c.conn
	c.conn = nil
	for nonce, p := range c.pending {
		p.fail(ErrClosed)
		delete(c.pending, nonce)
	}
	c.mu.Unlock()
	if conn != nil {
		_ = conn.Close(websocket.StatusNormalClosure, "client closed")
	}
	c.cancel()
	c.wg.Wait()
	return nil
}

// backoff returns the wait before reconnection attempt n (0-based):
// exponential from ReconnectMin to ReconnectMax, with the upper half
// randomized ("equal jitter") so that many agents do not reconnect in step.
func (c *Client) backoff(n int) time.Duration {
	d := attempt.Backoff{Growth: attempt.Exponential, Initial: c.cfg.ReconnectMin, Max: c.cfg.ReconnectMax}.Base(n + 1)
	half := d / 2
	return half + jitter(d-half)
}

// jitter returns a random duration in [0, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}
