package registry

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// Policy is the default decision for an intent no ACL rule of the target
// matches.
type Policy string

// The default policies.
const (
	// PolicySameOrg allows intents between org agents of the same org and
	// denies everything else. Personal agents belong to no org.
	PolicySameOrg Policy = "same-org"
	// PolicyAllow allows every intent no deny rule matches.
	PolicyAllow Policy = "allow"
	// PolicyDeny denies every intent no allow rule matches.
	PolicyDeny Policy = "deny"
)

// Visibility values of an agent.
const (
	// visibilityPublic agents appear in search results.
	visibilityPublic = "public"
	// visibilityUnlisted agents resolve by exact Beam ID only.
	visibilityUnlisted = "unlisted"
)

// EchoBeamID is the reserved Beam ID of the directory's built-in echo agent.
const EchoBeamID = "echo@beam.directory"

// defaultTouchInterval is how often, at most, Touch persists last_seen for
// one agent.
const defaultTouchInterval = 30 * time.Second

// Config configures a Registry. The zero value is usable.
type Config struct {
	// DefaultPolicy decides intents no ACL rule matches; default same-org.
	DefaultPolicy Policy
	// DefaultVisibility of new agents that do not ask for one; default public.
	DefaultVisibility string
	// OperatorAuth recognises operator credentials on a request and returns
	// the role ("viewer", "operator", "admin"). May be nil: no operators.
	OperatorAuth func(*http.Request) (role string, ok bool)
	// Clock is the time source; default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
	// EchoSecret, when set, lets a registration of echo@beam.directory that
	// carries "Authorization: Bearer <EchoSecret>" through. When empty the
	// echo Beam ID cannot be registered over HTTP.
	EchoSecret string
	// AllowInsecureEndpoints accepts http:// endpoints on 127.0.0.1, ::1 and
	// localhost (tests and local development). Otherwise only https://.
	AllowInsecureEndpoints bool
	// TouchInterval bounds last_seen writes per agent; default 30 s.
	TouchInterval time.Duration
	// Domain is the domain this directory serves: Beam IDs are registered
	// only in it and the orgs beneath it (default beam.directory: personal
	// IDs and every org). Pinned peers' domains are excluded (Peers).
	Domain string
	// Replicator, when set, replicates every mutation through the cluster
	// (federation/cluster's Router) once it says it is Replicating; nil on
	// a single node.
	Replicator Replicator
	// Peers, when set, answers for the agents of pinned peer directories
	// (federation); nil without federation.
	Peers Peers
	// OpenOrgs makes every registrant of an existing org an approved
	// member at once (a private directory whose registrants are all
	// trusted). Off by default: the org's owner or an operator approves.
	OpenOrgs bool
}

// Key is one entry of an agent's key history.
type Key struct {
	// PublicKey is the base64 SPKI DER encoding.
	PublicKey string
	// CreatedAt is when the key was registered.
	CreatedAt time.Time
	// RevokedAt is when the key was rotated out or revoked; zero while active.
	RevokedAt time.Time
}

// Revoked reports whether the key is no longer valid.
func (k Key) Revoked() bool { return !k.RevokedAt.IsZero() }

// Agent is a registered agent as the registry holds it in memory. Values
// returned by the registry are snapshots; their slices must not be modified.
type Agent struct {
	// BeamID is the agent's identity, e.g. "alice@acme.beam.directory".
	BeamID string
	// Org is the org label ("acme"), or "personal" for personal agents.
	Org string
	// Personal is true for agent@beam.directory identities.
	Personal bool
	// DisplayName is the human-readable name.
	DisplayName string
	// Capabilities are the agent's declared capabilities.
	Capabilities []string
	// PublicKey is the current Ed25519 key.
	PublicKey ed25519.PublicKey
	// PublicKeyB64 is PublicKey as base64 SPKI DER, as registered.
	PublicKeyB64 string
	// Email is the contact address (private).
	Email string
	// EmailVerified is never set from client input.
	EmailVerified bool
	// Description, LogoURL and Website are public profile fields.
	Description, LogoURL, Website string
	// Verified and VerificationTier are never set from client input.
	Verified         bool
	VerificationTier string
	// Visibility is "public" or "unlisted".
	Visibility string
	// HTTPEndpoint is the agent's direct HTTP delivery endpoint (private).
	HTTPEndpoint string
	// DHPublicKey is the optional X25519 key for end-to-end encryption.
	DHPublicKey string
	// CreatedAt, UpdatedAt and LastSeen are server times.
	CreatedAt, UpdatedAt, LastSeen time.Time
	// Keys is the key history, oldest first; the last unrevoked is current.
	Keys []Key
	// RequireSenderSignatures refuses intents to the agent that its
	// sender did not sign (settings.go).
	RequireSenderSignatures bool
	// AcceptAttestedPipelineHops lets an agent that requires sender
	// signatures receive pipeline hops, which the directory attests
	// (settings.go).
	AcceptAttestedPipelineHops bool

	apiKeyHash string
}

// TrustScore computes the agent's trust score at now (see the package doc).
func (a Agent) TrustScore(now time.Time) float64 {
	s := 0.3
	if a.Verified {
		s += 0.3
	}
	if a.VerificationTier != "" && a.VerificationTier != "basic" {
		s += 0.2
	}
	if !a.LastSeen.IsZero() && now.Sub(a.LastSeen) < 24*time.Hour {
		s += 0.2
	}
	if !a.CreatedAt.IsZero() && now.Sub(a.CreatedAt) > 7*24*time.Hour {
		s += 0.2
	}
	if s > 1 {
		s = 1
	}
	// Round to avoid 0.30000000000000004 style noise on the wire.
	return float64(int(s*100+0.5)) / 100
}

// Rule is one intent ACL rule.
type Rule struct {
	// ID is the rule's identifier.
	ID int64
	// Target is the Beam ID the rule protects.
	Target string
	// IntentType is the intent it applies to, or "*".
	IntentType string
	// AllowedFrom is the sender pattern: "*", a Beam ID, "*@domain", "*.x".
	AllowedFrom string
	// Effect is "allow" or "deny".
	Effect string
	// CreatedAt is when the rule was created.
	CreatedAt time.Time
	// CreatedBy names the actor that created it.
	CreatedBy string
}

// Registry is the agent registry. All methods are safe for concurrent use.
type Registry struct {
	log   *tracing.Log
	cfg   Config
	clock func() time.Time
	lg    *slog.Logger

	// writeMu serializes mutations: validation against the cache, the
	// log.Do transaction and the cache update happen under it.
	writeMu sync.Mutex

	mu     sync.RWMutex
	agents map[string]*entry // beam_id → agent
	rules  map[string][]Rule // target → rules (replaced, never mutated)
	ruleBy map[int64]Rule    // id → rule
	// Org membership and tombstones (orgs.go).
	orgs       map[string]bool   // orgs that exist
	members    map[string]string // beam_id → Member* state
	tombstones map[string]bool   // deleted Beam IDs not released

	// repl is the cluster replication state (replica.go).
	repl replica

	touchMu   sync.Mutex
	dirty     map[string]time.Time // beam_id → last_seen to persist
	kick      chan struct{}
	stop      chan struct{}
	flushDone chan struct{}
	closeOnce sync.Once
}

// entry holds one agent in the cache. The Agent is replaced under mu on
// every mutation, never modified; last_seen moves without the write lock.
type entry struct {
	agent     *Agent
	lastSeen  atomic.Int64 // unix µs; the newest of agent.LastSeen and Touch
	persisted atomic.Int64 // unix µs of the last value handed to the writer
}

func newEntry(a *Agent) *entry {
	e := &entry{agent: a}
	e.lastSeen.Store(micros(a.LastSeen))
	e.persisted.Store(micros(a.LastSeen))
	return e
}

// snapshot returns a copy of the agent with the current last_seen. The
// caller holds mu (read).
func (e *entry) snapshot() Agent {
	a := *e.agent
	if ls := e.lastSeen.Load(); ls > micros(a.LastSeen) {
		a.LastSeen = fromMicros(ls)
	}
	return a
}

// storeMax raises v to x.
func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if cur >= x || v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// Open creates the registry tables if needed, loads all agents, keys and
// ACL rules into memory and starts the last_seen flusher. Call Close before
// closing the log.
func Open(ctx context.Context, log *tracing.Log, cfg Config) (*Registry, error) {
	if log == nil {
		return nil, errors.New("registry: open: nil log")
	}
	switch cfg.DefaultPolicy {
	case "":
		cfg.DefaultPolicy = PolicySameOrg
	case PolicySameOrg, PolicyAllow, PolicyDeny:
	default:
		return nil, fmt.Errorf("registry: open: unknown default policy %q", cfg.DefaultPolicy)
	}
	switch cfg.DefaultVisibility {
	case "":
		cfg.DefaultVisibility = visibilityPublic
	case visibilityPublic, visibilityUnlisted:
	default:
		return nil, fmt.Errorf("registry: open: unknown default visibility %q", cfg.DefaultVisibility)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TouchInterval <= 0 {
		cfg.TouchInterval = defaultTouchInterval
	}
	if cfg.Domain == "" {
		cfg.Domain = wire.BeamDomain
	}
	if _, err := wire.ParseBeamID("x@" + cfg.Domain); err != nil {
		return nil, fmt.Errorf("registry: open: domain %q: want beam.directory or <org>.beam.directory", cfg.Domain)
	}
	r := &Registry{
		log:       log,
		cfg:       cfg,
		clock:     cfg.Clock,
		lg:        cfg.Logger.With("component", "registry"),
		agents:    map[string]*entry{},
		rules:     map[string][]Rule{},
		ruleBy:    map[int64]Rule{},
		dirty:     map[string]time.Time{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		flushDone: make(chan struct{}),
	}
	if err := r.migrate(ctx); err != nil {
		return nil, err
	}
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	if err := r.loadApplied(ctx); err != nil {
		return nil, err
	}
	if err := r.loadOrgs(ctx); err != nil {
		return nil, err
	}
	go r.flusher()
	return r, nil
}

// Close stops the last_seen flusher after persisting pending updates. It
// does not close the log.
func (r *Registry) Close(ctx context.Context) error {
	var err error
	r.closeOnce.Do(func() {
		close(r.stop)
		select {
		case <-r.flushDone:
		case <-ctx.Done():
			err = fmt.Errorf("registry: close: %w", ctx.Err())
			return
		}
		err = r.flush(ctx)
	})
	return err
}

func (r *Registry) now() time.Time { return r.clock().UTC() }

// Get returns the agent registered as beamID (exact, lowercase form).
func (r *Registry) Get(beamID string) (Agent, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.agents[beamID]
	if !ok {
		return Agent{}, false
	}
	return e.snapshot(), true
}

// Count returns the number of registered agents.
func (r *Registry) Count() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.agents)
}

// Stats returns the number of registered agents and of verified ones.
func (r *Registry) Stats() (total, verified int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.agents {
		if e.agent.Verified {
			verified++
		}
	}
	return len(r.agents), verified
}

// Rules returns the ACL rules that protect target, in id order.
func (r *Registry) Rules(target string) []Rule {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]Rule(nil), r.rules[target]...)
}

// AuthenticateAPIKey returns the agent that owns key. The Beam ID is read
// from the key, and the key's SHA-256 digest is compared in constant time
// with the stored one.
func (r *Registry) AuthenticateAPIKey(key string) (Agent, bool) {
	beamID, ok := beamIDFromAPIKey(key)
	if !ok {
		return Agent{}, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.agents[beamID]
	if !ok || !apiKeyMatches(key, e.agent.apiKeyHash) {
		return Agent{}, false
	}
	return e.snapshot(), true
}

// Touch records that beamID was seen now. The in-memory last_seen changes
// at once; the row is written asynchronously, at most once per agent per
// TouchInterval. Touch never blocks on SQLite.
func (r *Registry) Touch(beamID string) {
	now := r.now()
	us := micros(now)
	r.mu.RLock()
	e, ok := r.agents[beamID]
	r.mu.RUnlock()
	if !ok {
		return
	}
	storeMax(&e.lastSeen, us)
	last := e.persisted.Load()
	if us-last < r.cfg.TouchInterval.Microseconds() || !e.persisted.CompareAndSwap(last, us) {
		return
	}
	r.touchMu.Lock()
	r.dirty[beamID] = now
	r.touchMu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// flusher writes dirty last_seen values until Close.
func (r *Registry) flusher() {
	defer close(r.flushDone)
	for {
		select {
		case <-r.stop:
			return
		case <-r.kick:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := r.flush(ctx); err != nil {
				r.lg.Warn("persist last_seen", "err", err)
			}
			cancel()
		}
	}
}

// flush writes all dirty last_seen values in one transaction.
func (r *Registry) flush(ctx context.Context) error {
	r.touchMu.Lock()
	batch := r.dirty
	r.dirty = map[string]time.Time{}
	r.touchMu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	ids := make([]string, 0, len(batch))
	for id := range batch {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return r.doLocal(ctx, func(tx *sqlx.Tx) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx,
				`UPDATE agents SET last_seen = ? WHERE beam_id = ? AND last_seen < ?`,
				micros(batch[id]), id, micros(batch[id])); err != nil {
				return fmt.Errorf("update last_seen of %s: %w", id, err)
			}
		}
		return nil
	})
}

// setAgent replaces the cached agent (nil deletes it).
func (r *Registry) setAgent(beamID string, a *Agent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a == nil {
		delete(r.agents, beamID)
		for _, rule := range r.rules[beamID] {
			delete(r.ruleBy, rule.ID)
		}
		delete(r.rules, beamID)
		return
	}
	e, ok := r.agents[beamID]
	if !ok {
		r.agents[beamID] = newEntry(a)
		return
	}
	// The mutation wrote a.LastSeen to the row; a Touch that landed while
	// it was in flight stays newer in e.lastSeen.
	e.agent = a
	storeMax(&e.lastSeen, micros(a.LastSeen))
	storeMax(&e.persisted, micros(a.LastSeen))
}

// did returns the agent's DID, or "" when its Beam ID does not parse.
func (a *Agent) did() string {
	id, err := wire.ParseBeamID(a.BeamID)
	if err != nil {
		return ""
	}
	return id.DID()
}
