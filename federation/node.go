package federation

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/attempt"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

// Defaults of Config.
const (
	defaultClaimLease      = 3 * time.Minute
	defaultPollInterval    = 500 * time.Millisecond
	defaultMaxInFlight     = 32
	defaultMaxInbound      = 256
	defaultRetryBase       = 200 * time.Millisecond
	defaultSyncRetryMax    = time.Second
	defaultDurableRetryMax = 30 * time.Second
	defaultDurableMaxAge   = 24 * time.Hour
	defaultDurableTimeout  = 60 * time.Second
	defaultKeyTTL          = 5 * time.Minute
	defaultResolveTimeout  = 5 * time.Second
	// maxIntentTimeout bounds the result timeout a forwarded intent may ask.
	maxIntentTimeout = 5 * time.Minute
)

// Config configures a Node. Domain, Key, Log, Directory and Registry are
// required, and one of NATSListen or NATSURL.
type Config struct {
	// Domain is this directory's domain, e.g. acme.beam.directory.
	Domain string
	// Key is the directory key (LoadOrCreateKey).
	Key ed25519.PrivateKey
	// Log is the event log; the outbox and the peer tables live in its file.
	Log *tracing.Log
	// Directory is the relay; forwarded intents enter it and results of
	// intents it forwarded settle its waiters.
	Directory *directory.Directory
	// Registry answers key resolution requests for this directory's agents.
	Registry *registry.Registry
	// BusOutcome, when set, is called with the nonce after the outcome of a
	// bus-owned intent forwarded by Forward (delivered, acked, failed, or
	// dead_letter when its row dies) is committed in the log: the message
	// bus counts it and notifies the sender.
	BusOutcome func(nonce string)
	// Router, when set, is the Router the directory and the bus were given
	// (their Config.Remote): New points it at this node.
	Router *Router

	// NATSListen (host:port, port 0 for a random one) starts the embedded
	// NATS server: pinned peers authenticate to it with their nkeys.
	NATSListen string
	// NATSURL connects to an existing NATS deployment instead; peers are
	// reached through it and its operator enforces the subject permissions
	// (see the package documentation).
	NATSURL string
	// Peers are pinned at start (beam serve --peer), in addition to the
	// peers stored in the log's file.
	Peers []Peer

	// Clock is the time source; default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the federation metrics; nil means none.
	Registerer prometheus.Registerer
	// OperatorAuth recognises operator requests of the HTTP API; nil
	// refuses every request.
	OperatorAuth func(*http.Request) bool

	// RelayID names this process's claims; default domain/random.
	RelayID string
	// ClaimLease is how long a claim may be held before it is reaped (3 m).
	ClaimLease time.Duration
	// PollInterval is how often the relay looks for due rows (500 ms).
	PollInterval time.Duration
	// MaxInFlight bounds concurrent publishes (32).
	MaxInFlight int
	// MaxInbound bounds concurrently handled inbound requests (256).
	MaxInbound int
	// RetryBase is the first backoff (200 ms); it doubles per attempt up to
	// SyncRetryMax (1 s) for rows whose sender waits, DurableRetryMax (30
	// s) for durable ones.
	RetryBase, SyncRetryMax, DurableRetryMax time.Duration
	// DurableMaxAge terminates durable rows older than it (24 h);
	// MaxAttempts terminates rows after that many attempts (0: unlimited).
	DurableMaxAge time.Duration
	MaxAttempts   int
	// DurableTimeout is the result timeout of durable intents that carry
	// none (60 s).
	DurableTimeout time.Duration
	// KeyTTL is how long a resolved remote agent key is cached (5 m).
	KeyTTL time.Duration
	// ServerOptions, when set, adjusts the embedded NATS server's options
	// at start (cluster mode adds routes and JetStream, see
	// federation/cluster). The options are never reloaded: peers change
	// the server's client authentication (natsauth.go) instead.
	ServerOptions func(*server.Options)
	// QueueGroup, when set, subscribes this directory's subjects in that
	// queue group, so that of the nodes of a cluster serving one domain
	// exactly one handles each federation message.
	QueueGroup string
	// BeforeSubscribe, when set, runs once the NATS connection is up and
	// before this directory subscribes its subjects; an error fails New
	// (cluster mode checks the node's directory key there, so a node the
	// cluster refuses never joins the queue group).
	BeforeSubscribe func(nc *nats.Conn) error
}

// peerState is a pinned peer and the connection that reaches it.
type peerState struct {
	Peer
	conn *nats.Conn // own connection to the peer's server (embedded mode)
	// downSince is when conn was last seen without a connection (or was
	// opened); zero while it is connected. wasUp: conn has been connected.
	downSince time.Time
	wasUp     bool
}

type cachedKey struct {
	pub     ed25519.PublicKey
	fetched time.Time
}

// Node is one directory's federation endpoint: the NATS server or
// connection, the pinned peers, the outbox relay and the inbound handlers.
// It implements directory.Remote.
type Node struct {
	cfg    Config
	lg     *slog.Logger
	clock  func() time.Time
	outbox *Outbox
	store  peerStore
	m      *metrics
	nkey   nkeys.KeyPair
	self   Peer

	ns       *server.Server
	auth     *natsAuth // the embedded server's client authentication
	natsHost string
	natsPort int
	tls      *tls.Config // the embedded server's certificate (tls.go)
	shared   *nats.Conn  // embedded: in-process local connection; external: the one connection
	sub      *nats.Subscription

	mu       sync.Mutex
	peers    map[string]*peerState // domain → peer
	byToken  map[string]string     // subject token → domain
	keys     map[string]cachedKey  // remote agent → key
	contacts map[string]time.Time  // unsaved last contacts

	// relay claims due rows and publishes them (relay.go); house reaps
	// expired claims and stores last contacts.
	relay, house attempt.Loop
	slots        chan struct{} // publishes in flight, at most MaxInFlight
	inbound      chan struct{}
	once         sync.Once
}

// New opens the outbox and the peer store, pins cfg.Peers, starts the
// embedded NATS server or connects to cfg.NATSURL, and subscribes to this
// directory's subjects. Call Start to run the relay and Close to stop.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if err := ValidDomain(cfg.Domain); err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("federation: missing directory key")
	}
	if cfg.Log == nil || cfg.Directory == nil || cfg.Registry == nil {
		return nil, errors.New("federation: log, directory and registry are required")
	}
	if (cfg.NATSListen == "") == (cfg.NATSURL == "") {
		return nil, errors.New("federation: set exactly one of NATSListen and NATSURL")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defDur(&cfg.ClaimLease, defaultClaimLease)
	defDur(&cfg.PollInterval, defaultPollInterval)
	defDur(&cfg.RetryBase, defaultRetryBase)
	defDur(&cfg.SyncRetryMax, defaultSyncRetryMax)
	defDur(&cfg.DurableRetryMax, defaultDurableRetryMax)
	defDur(&cfg.DurableMaxAge, defaultDurableMaxAge)
	defDur(&cfg.DurableTimeout, defaultDurableTimeout)
	defDur(&cfg.KeyTTL, defaultKeyTTL)
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = defaultMaxInFlight
	}
	if cfg.MaxInbound <= 0 {
		cfg.MaxInbound = defaultMaxInbound
	}
	if cfg.RelayID == "" {
		cfg.RelayID = cfg.Domain + "/" + newID()[:12]
	}
	kp, err := nkeyPair(cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	ob, err := OpenOutbox(ctx, cfg.Log, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	n := &Node{
		cfg: cfg, lg: cfg.Logger.With("component", "federation", "domain", cfg.Domain), clock: cfg.Clock,
		outbox: ob, store: peerStore{log: cfg.Log}, m: m, nkey: kp,
		peers: map[string]*peerState{}, byToken: map[string]string{}, keys: map[string]cachedKey{},
		contacts: map[string]time.Time{},
		slots:    make(chan struct{}, cfg.MaxInFlight), inbound: make(chan struct{}, cfg.MaxInbound),
	}
	n.relay.Interval, n.relay.Tick, n.relay.Logger, n.relay.Name = cfg.PollInterval, n.relayTick, n.lg, "federation relay"
	n.house.Interval, n.house.Tick, n.house.Logger, n.house.Name = min(cfg.ClaimLease/4, 10*time.Second), n.housekeep, n.lg, "federation housekeeping"
	n.self = Peer{Domain: cfg.Domain, PublicKey: cfg.Key.Public().(ed25519.PublicKey)}
	m.outboxCounts = ob.Counts

	stored, err := n.store.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	now := n.clock()
	for _, p := range cfg.Peers {
		if p.Domain == cfg.Domain {
			return nil, fmt.Errorf("federation: peer %s is this directory", p.Domain)
		}
		p.AddedAt = now
		if err := n.store.put(ctx, p); err != nil {
			return nil, fmt.Errorf("federation: %w", err)
		}
	}
	if len(cfg.Peers) > 0 {
		if stored, err = n.store.load(ctx); err != nil {
			return nil, fmt.Errorf("federation: %w", err)
		}
	}
	for _, p := range stored {
		n.peers[p.Domain] = &peerState{Peer: p}
		n.byToken[Token(p.Domain)] = p.Domain
	}
	if err := n.startNATS(); err != nil {
		n.closeNATS()
		return nil, fmt.Errorf("federation: %w", err)
	}
	n.mu.Lock()
	for _, ps := range n.peers {
		n.connectPeerLocked(ps)
	}
	n.m.peers.Set(float64(len(n.peers)))
	n.mu.Unlock()
	if cfg.Router != nil {
		cfg.Router.node.Store(n)
	}
	return n, nil
}

// startNATS starts the embedded server (or connects to the external one)
// and subscribes to this directory's subjects.
func (n *Node) startNATS() error {
	pub, err := n.nkey.PublicKey()
	if err != nil {
		return fmt.Errorf("nkey: %w", err)
	}
	baseOpts := []nats.Option{
		nats.Nkey(pub, n.nkey.Sign),
		nats.CustomInboxPrefix(InboxPrefix(n.cfg.Domain)),
		nats.Name("beam " + n.cfg.Domain),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(n.asyncError),
	}
	if n.cfg.NATSURL != "" {
		nc, err := nats.Connect(n.cfg.NATSURL, append(baseOpts, nats.RetryOnFailedConnect(true))...)
		if err != nil {
			return fmt.Errorf("connect %s: %w", n.cfg.NATSURL, err)
		}
		n.shared = nc
	} else {
		host, portStr, err := net.SplitHostPort(n.cfg.NATSListen)
		if err != nil {
			return fmt.Errorf("nats listen %q: %w", n.cfg.NATSListen, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil || port < 0 || port > 65535 {
			return fmt.Errorf("nats listen %q: bad port", n.cfg.NATSListen)
		}
		if port == 0 {
			port = server.RANDOM_PORT
		}
		n.natsHost, n.natsPort = host, port
		if n.tls, err = serverTLS(n.cfg.Key, n.cfg.Domain); err != nil {
			return err
		}
		n.auth = newNATSAuth(n.cfg.Domain)
		n.mu.Lock()
		n.syncAuthLocked()
		n.mu.Unlock()
		ns, err := server.NewServer(n.natsOptions())
		if err != nil {
			return fmt.Errorf("nats server: %w", err)
		}
		n.auth.mu.Lock()
		n.auth.ns = ns
		n.auth.mu.Unlock()
		ns.SetLoggerV2(&natsLogger{lg: n.lg.With("component", "nats"), m: n.m}, false, false, false)
		go ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			ns.Shutdown()
			return fmt.Errorf("nats server on %s did not start", n.cfg.NATSListen)
		}
		n.ns = ns
		if a, ok := ns.Addr().(*net.TCPAddr); ok {
			n.natsPort = a.Port
		}
		nc, err := nats.Connect("", append(baseOpts, nats.InProcessServer(ns))...)
		if err != nil {
			return fmt.Errorf("connect in process: %w", err)
		}
		n.shared = nc
	}
	n.self.URL = "nats://" + n.NATSAddr()
	if n.cfg.BeforeSubscribe != nil {
		if err := n.cfg.BeforeSubscribe(n.shared); err != nil {
			return err
		}
	}
	subject := subjectPrefix + "." + Token(n.cfg.Domain) + ".>"
	var sub *nats.Subscription
	if n.cfg.QueueGroup != "" {
		sub, err = n.shared.QueueSubscribe(subject, n.cfg.QueueGroup, n.onMessage)
	} else {
		sub, err = n.shared.Subscribe(subject, n.onMessage)
	}
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	sub.SetPendingLimits(16384, 64<<20)
	n.sub = sub
	return n.shared.Flush()
}

// natsOptions builds the embedded server's options. Clients are admitted
// by n.auth: this directory unrestricted, each pinned peer publishing only
// its own subjects towards this directory and subscribing only to its own
// reply inbox. AlwaysEnableNonce makes the server send the nonce that
// clients sign with their nkey.
func (n *Node) natsOptions() *server.Options {
	opts := &server.Options{
		TLSConfig:                  n.tls,
		TLSTimeout:                 5,
		ServerName:                 "beam-" + Token(n.cfg.Domain),
		Host:                       n.natsHost,
		Port:                       n.natsPort,
		NoSigs:                     true,
		MaxPayload:                 maxMessageBytes * 2,
		AlwaysEnableNonce:          true,
		CustomClientAuthentication: n.auth,
	}
	if n.cfg.ServerOptions != nil {
		n.cfg.ServerOptions(opts)
	}
	return opts
}

// peerPermissions are the NATS permissions of peer on self's server:
// publish only beam.fed.<self>.<peer>.*, subscribe only to the peer's own
// reply inbox, and never JetStream, the system account's or a cluster's
// subjects (reservedSubjects). Operators of a shared NATS deployment grant
// the same.
func peerPermissions(self, peer string) *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{subjectPrefix + "." + Token(self) + "." + Token(peer) + ".*"},
			Deny: reservedSubjects()},
		Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix(peer) + ".>"}, Deny: reservedSubjects()},
	}
}

// reservedSubjects are the subjects only a directory's own nodes use:
// JetStream's API and storage ($JS, $KV, $O), the system account's and
// cluster mode's (beam.cluster). No peer or other client may publish or
// subscribe to them.
func reservedSubjects() []string {
	return []string{"$JS.>", "$KV.>", "$O.>", "$SYS.>", "$NRG.>", "beam.cluster.>"}
}

// SharedPermissions are the NATS permissions of the directory domain on a
// shared deployment (--nats-url): it may send requests only as itself
// (publish beam.fed.*.<domain>.*), answer requests addressed to it (one
// response per request), and subscribe only to its own subjects and reply
// inbox. Operators grant these to each directory's nkey user (see
// docs/FEDERATION.md); the test of the shared mode runs with them.
func SharedPermissions(domain string) *server.Permissions {
	tok := Token(domain)
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{subjectPrefix + ".*." + tok + ".*"}, Deny: reservedSubjects()},
		Subscribe: &server.SubjectPermission{Allow: []string{subjectPrefix + "." + tok + ".>", InboxPrefix(domain) + ".>"},
			Deny: reservedSubjects()},
		Response: &server.ResponsePermission{MaxMsgs: 1, Expires: maxIntentTimeout + time.Minute},
	}
}

// UserConfig is the nats-server configuration entry (one element of
// authorization.users) of the nkey user of directory key pub with
// permissions p (allow and deny lists and allow_responses).
func UserConfig(domain string, pub ed25519.PublicKey, p *server.Permissions) (string, error) {
	if err := ValidDomain(domain); err != nil {
		return "", err
	}
	user, err := NkeyUser(pub)
	if err != nil {
		return "", err
	}
	list := func(subjects []string) string {
		q := make([]string, len(subjects))
		for i, s := range subjects {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	deny := func(subjects []string) string {
		if len(subjects) == 0 {
			return ""
		}
		return ", deny: " + list(subjects)
	}
	return fmt.Sprintf(`# beam directory %s
{
  nkey: %q
  permissions: {
    publish: { allow: %s%s }
    subscribe: { allow: %s%s }
    allow_responses: { max: %d, expires: %q }
  }
}
`, domain, user, list(p.Publish.Allow), deny(p.Publish.Deny), list(p.Subscribe.Allow), deny(p.Subscribe.Deny),
		p.Response.MaxMsgs, p.Response.Expires.String()), nil
}

// connectPeerLocked opens this directory's connection to ps's server
// (embedded mode). It connects in the background and keeps reconnecting.
func (n *Node) connectPeerLocked(ps *peerState) {
	if n.cfg.NATSURL != "" || ps.conn != nil {
		return
	}
	pub, _ := n.nkey.PublicKey()
	// A connection made is contact: the peer's TLS certificate verified
	// against the pinned key.
	ps.downSince = n.clock()
	up := func(*nats.Conn) { n.linkUp(ps) }
	nc, err := nats.Connect(ps.URL,
		nats.ConnectHandler(up),
		nats.ReconnectHandler(up),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { n.linkLost(ps) }),
		nats.Secure(PeerTLS(ps.PublicKey)),
		nats.Nkey(pub, n.nkey.Sign),
		nats.CustomInboxPrefix(InboxPrefix(n.cfg.Domain)),
		nats.Name("beam "+n.cfg.Domain+" → "+ps.Domain),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(n.asyncError),
	)
	if err != nil {
		n.lg.Warn("connect to peer", "peer", ps.Domain, "url", ps.URL, "err", err)
		return
	}
	ps.conn = nc
}

// linkUp notes that ps's connection is made: contact, and the link is up.
func (n *Node) linkUp(ps *peerState) {
	n.mu.Lock()
	ps.downSince, ps.wasUp = time.Time{}, true
	n.mu.Unlock()
	n.contact(ps.Domain)
}

// linkLost notes that ps's connection dropped.
func (n *Node) linkLost(ps *peerState) {
	n.mu.Lock()
	if ps.downSince.IsZero() {
		ps.downSince = n.clock()
	}
	n.mu.Unlock()
}

func (n *Node) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) {
		n.m.rejected.WithLabelValues(rejectPermission).Inc()
	}
	n.lg.Warn("nats error", "err", err)
}

// Start runs the outbox relay until Close. Claims of an earlier process
// are released first.
func (n *Node) Start(ctx context.Context) error {
	if k, err := n.outbox.ReapOthers(ctx, n.cfg.RelayID); err != nil {
		return fmt.Errorf("federation start: %w", err)
	} else if k > 0 {
		n.lg.Info("released claims of an earlier process", "rows", k)
	}
	// The loops run until Close, not until the end of ctx.
	n.relay.Start(context.Background())
	n.house.Start(context.Background())
	n.Kick()
	return nil
}

// Close stops the relay (waiting for publishes in flight), the
// connections and the embedded server. It does not close the log.
func (n *Node) Close() error {
	n.once.Do(func() {
		n.relay.Close()
		n.house.Close()
		// Wait for publishes in flight.
		for range cap(n.slots) {
			n.slots <- struct{}{}
		}
		n.flushContacts()
		n.closeNATS()
	})
	return nil
}

func (n *Node) closeNATS() {
	n.mu.Lock()
	for _, ps := range n.peers {
		if ps.conn != nil {
			ps.conn.Close()
			ps.conn = nil
		}
	}
	n.mu.Unlock()
	if n.shared != nil {
		n.shared.Close()
	}
	if n.ns != nil {
		n.ns.Shutdown()
		n.ns.WaitForShutdown()
	}
}

// Kick wakes the relay (a row was written).
func (n *Node) Kick() { n.relay.Kick() }

// Outbox returns the node's outbox.
func (n *Node) Outbox() *Outbox { return n.outbox }

// isPeerDomain reports whether a pinned peer serves domain.
func (n *Node) isPeerDomain(domain string) bool {
	if domain == n.cfg.Domain {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.peers[domain]
	return ok
}

// Domain returns this directory's domain.
func (n *Node) Domain() string { return n.cfg.Domain }

// NATSAddr is the embedded server's host:port, or the NATS URL's host in
// external mode.
func (n *Node) NATSAddr() string {
	if n.ns == nil {
		if u := n.shared; u != nil && u.ConnectedUrl() != "" {
			return u.ConnectedUrlRedacted()
		}
		return n.cfg.NATSURL
	}
	return net.JoinHostPort(n.natsHost, strconv.Itoa(n.natsPort))
}

// Conn is this directory's own NATS connection (in process to the
// embedded server, or to NATSURL); nil after Close.
func (n *Node) Conn() *nats.Conn { return n.shared }

// Self returns this directory as a peer (its line is what others pin).
func (n *Node) Self() Peer { return n.self }

// Peers returns the pinned peers with their last contact.
func (n *Node) Peers() []Peer {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Peer, 0, len(n.peers))
	for _, ps := range n.peers {
		p := ps.Peer
		if t, ok := n.contacts[p.Domain]; ok && t.After(p.LastContact) {
			p.LastContact = t
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Domain < out[j].Domain })
	return out
}

// AddPeer pins p (replacing the URL and key of a peer with its domain),
// stores it and lets it connect. The connections of a replaced key are
// closed.
func (n *Node) AddPeer(ctx context.Context, p Peer) error {
	p.Domain = normDomain(p.Domain)
	if err := ValidDomain(p.Domain); err != nil {
		return err
	}
	if p.Domain == n.cfg.Domain {
		return fmt.Errorf("peer %s is this directory", p.Domain)
	}
	if len(p.PublicKey) != ed25519.PublicKeySize {
		return errors.New("peer key is not an Ed25519 public key")
	}
	p.AddedAt = n.clock()
	if err := n.store.put(ctx, p); err != nil {
		return err
	}
	n.disconnectClients(n.pin(p))
	return nil
}

// pin applies an added peer and returns the embedded server's clients to
// disconnect.
func (n *Node) pin(p Peer) []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.peers[p.Domain]; ok {
		if old.URL == p.URL && keyMatches(old.PublicKey, p.PublicKey) {
			return nil
		}
		p.AddedAt = old.AddedAt
		if old.conn != nil {
			old.conn.Close()
		}
	}
	ps := &peerState{Peer: p}
	n.peers[p.Domain] = ps
	n.byToken[Token(p.Domain)] = p.Domain
	for k := range n.keys {
		if d, err := domainOf(k); err == nil && d == p.Domain {
			delete(n.keys, k)
		}
	}
	n.m.peers.Set(float64(len(n.peers)))
	n.connectPeerLocked(ps)
	return n.syncAuthLocked()
}

// RemovePeer unpins a peer: its live connections are closed, new ones
// are refused and its pending rows die when they are next claimed.
func (n *Node) RemovePeer(ctx context.Context, domain string) (bool, error) {
	domain = normDomain(domain)
	ok, err := n.store.remove(ctx, domain)
	if err != nil {
		return false, err
	}
	n.mu.Lock()
	if ps, found := n.peers[domain]; found {
		if ps.conn != nil {
			ps.conn.Close()
		}
		delete(n.peers, domain)
		delete(n.byToken, Token(domain))
		ok = true
	}
	n.m.peers.Set(float64(len(n.peers)))
	cut := n.syncAuthLocked()
	n.mu.Unlock()
	n.disconnectClients(cut)
	return ok, nil
}

// pinnedKey returns the pinned key of a peer domain.
func (n *Node) pinnedKey(domain string) (ed25519.PublicKey, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ps, ok := n.peers[domain]
	if !ok {
		return nil, false
	}
	return ps.PublicKey, true
}

// connFor returns the connection that reaches peer.
func (n *Node) connFor(peer string) (*nats.Conn, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ps, ok := n.peers[peer]
	if !ok {
		return nil, false
	}
	if n.cfg.NATSURL != "" {
		return n.shared, true
	}
	return ps.conn, ps.conn != nil
}

// contact notes a verified message from peer.
func (n *Node) contact(peer string) {
	now := n.clock()
	n.mu.Lock()
	n.contacts[peer] = now
	n.mu.Unlock()
	n.m.lastContact.WithLabelValues(peer).Set(float64(now.UnixMilli()) / 1000)
}

// flushContacts stores the last contacts noted since the last flush.
func (n *Node) flushContacts() {
	n.mu.Lock()
	c := n.contacts
	n.contacts = map[string]time.Time{}
	for d, t := range c {
		if ps, ok := n.peers[d]; ok && t.After(ps.LastContact) {
			ps.LastContact = t
		}
	}
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.store.touch(ctx, c); err != nil {
		n.lg.Warn("store last contact", "err", err)
	}
}

// housekeep reaps expired claims and stores last contacts.
func (n *Node) housekeep(context.Context) error {
	defer n.flushContacts()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k, err := n.outbox.Reap(ctx, n.cfg.ClaimLease)
	if err != nil {
		return fmt.Errorf("reap claims: %w", err)
	}
	if k > 0 {
		n.m.reaped.Add(float64(k))
		n.lg.Info("reaped expired claims", "rows", k)
		n.Kick()
	}
	return nil
}

// Status summarises federation for operators: this directory, its peers with
// their last contact and link state, the outbox by state with the dead
// rows, and each peer's backlog (depth, oldest waiting row, last error).
func (n *Node) Status(ctx context.Context) (any, error) {
	counts, err := n.outbox.Counts(ctx)
	if err != nil {
		return nil, fmt.Errorf("federation status: %w", err)
	}
	dead, err := n.outbox.Rows(ctx, Dead, 50)
	if err != nil {
		return nil, fmt.Errorf("federation status: %w", err)
	}
	if dead == nil {
		dead = []Row{}
	}
	links, err := n.Links(ctx)
	if err != nil {
		return nil, fmt.Errorf("federation status: %w", err)
	}
	backlog, err := n.outbox.Backlogs(ctx)
	if err != nil {
		return nil, fmt.Errorf("federation status: %w", err)
	}
	return map[string]any{
		"self":    n.Self(),
		"peers":   n.Peers(),
		"outbox":  counts,
		"dead":    dead,
		"links":   links,
		"backlog": backlog,
	}, nil
}
