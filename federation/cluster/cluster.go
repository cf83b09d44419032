package cluster

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
)

// NodeIDFile holds a node's generated ID inside its data directory.
const NodeIDFile = "cluster.node"

var nodeIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// validNodeID checks that id can name a node in NATS subjects and server
// names: 1–32 of a-z, 0-9 and '-', not starting with '-'.
func validNodeID(id string) error {
	if !nodeIDPattern.MatchString(id) {
		return fmt.Errorf("node id %q: want 1-32 of a-z, 0-9 and '-'", id)
	}
	return nil
}

// LoadOrCreateNodeID returns the node ID stored in dataDir, generating and
// storing one on first start.
func LoadOrCreateNodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, NodeIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if err := validNodeID(id); err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read node id: %w", err)
	}
	raw := make([]byte, 5)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("generate node id: %w", err)
	}
	id := "n" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("store node id: %w", err)
	}
	return id, nil
}

// Token is the subject token of a domain (dots replaced).
func Token(domain string) string { return strings.ReplaceAll(domain, ".", "_") }

// Config configures a Node.
type Config struct {
	// Domain is the domain every node of the cluster serves.
	Domain string
	// NodeID names this node (LoadOrCreateNodeID).
	NodeID string
	// Listen is the route listener (host:port) of the embedded NATS
	// server; empty with an external NATS deployment.
	Listen string
	// Routes are the other nodes' route URLs (nats-route://host:port).
	Routes []string
	// Replicas of the cluster's streams; 0 means min(3, nodes), nodes
	// being this one and its routes.
	Replicas int
	// Trust holds the route credentials (LoadTrust); required with Listen.
	Trust *Trust
	// StoreDir is the JetStream store of the embedded server.
	StoreDir string
	// Registry is this node's registry; the cluster replicates its changes.
	Registry *registry.Registry
	// Directory is this node's relay; intents for agents other nodes hold
	// leave it through the node (routing.go). Nil: no routing.
	Directory *directory.Directory
	// Router is the Router the registry and the directory were given
	// (registry.Config.Replicator, directory.Config.Cluster): Start points
	// it at this node once it joined, and turns the registry's replication
	// on once it caught up on the stream. Without it the node neither
	// replicates the registry nor routes intents.
	Router *Router
	// Sessions, when set, counts the WebSocket sessions this node holds
	// (shown to the other nodes).
	Sessions func() int
	// DirectoryKey is this node's directory public key (encoded), which
	// must be the one the cluster announces (identity.go); empty skips the
	// check.
	DirectoryKey string
	// Key is the directory key every node holds (the private half of
	// DirectoryKey): it signs what this node writes for the others and
	// proves its membership to them (seal.go). Required.
	Key ed25519.PrivateKey
	// JobBus says this node serves the Intent Protocol job bus: the first
	// such node to start becomes its home (homes.go).
	JobBus bool
	// LogID is this node's log ID, written into the homes it takes; may
	// be empty.
	LogID string
	// Log is this node's event log, shipped to the log stream so that
	// another node takes it over when this one is gone, and into which
	// this node imports the logs it takes over (logship.go, takeover.go).
	// Nil: the log is not shipped and no log is taken over.
	Log Log
	// Adopt, called once a lost node's log (logID, written by node) is
	// imported, has this node take over the log's unfinished work and
	// returns the items adopted by kind. It must be idempotent: a takeover
	// interrupted is done again.
	Adopt func(ctx context.Context, logID, node string) (map[string]int, error)
	// TakeoverGrace is how long a node must have been gone before its log
	// is taken over; 0 means DefaultTakeoverGrace.
	TakeoverGrace time.Duration
	// Registerer receives the cluster's metrics; nil: not exported.
	Registerer prometheus.Registerer
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
}

// Node is one node's part of the cluster: the JetStream resources and the
// registry applier.
type Node struct {
	cfg    Config
	lg     *slog.Logger
	host   string
	port   int
	routes []*url.URL

	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	subj    string
	members membership
	route   router

	rejected rejected

	// logs is the log stream; ship this node's log in it, take the logs
	// it takes over (nil Log: unused).
	logs jetstream.Stream
	ship shipper
	take takeovers

	// callNext answers the bus calls of other nodes (BusHandler).
	callNext  atomic.Pointer[http.Handler]
	calls     callLedger
	callSlots chan struct{}
	callSub   *nats.Subscription
	started   time.Time
	// meshAuth authenticates pipeline gateway requests (MeshAuth);
	// streams serves and bounds forwarded event streams (stream.go).
	meshAuth atomic.Pointer[func(*http.Request) (directory.BusPrincipal, bool)]
	streams  streams

	// homes are the services' home nodes; jobs answers the job bus calls
	// of other nodes (JobsHandler).
	homes     homes
	jobs      atomic.Pointer[jobsServer]
	jobsSlots chan struct{}
	jobsSub   *nats.Subscription

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// identityChecked: CheckIdentity passed before Start.
	identityChecked bool
}

// New validates cfg. Apply ServerOptions to the embedded NATS server, then
// call Start with a connection to it.
func New(cfg Config) (*Node, error) {
	if cfg.Domain == "" {
		return nil, errors.New("cluster: a domain is required")
	}
	if err := validNodeID(cfg.NodeID); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if cfg.Registry == nil {
		return nil, errors.New("cluster: a registry is required")
	}
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("cluster: the directory key is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rej, err := newRejected(cfg.Registerer, cfg.Registry.Rejected)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, lg: cfg.Logger.With("component", "cluster", "node", cfg.NodeID),
		subj: "beam.cluster." + Token(cfg.Domain) + ".registry", rejected: rej,
		callSlots: make(chan struct{}, maxCallsServed), jobsSlots: make(chan struct{}, maxJobsServed), started: time.Now()}
	if cfg.Log != nil {
		n.ship.fenced = make(chan struct{})
		n.take.gone, n.take.done, n.take.mine, n.take.owner = map[string]time.Time{}, map[string]bool{}, map[string]bool{}, map[string]string{}
		if n.take.count, n.take.duration, err = newTakeoverMetrics(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	if cfg.Listen != "" {
		host, portStr, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("cluster listen %q: %w", cfg.Listen, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil || port < 0 || port > 65535 {
			return nil, fmt.Errorf("cluster listen %q: bad port", cfg.Listen)
		}
		if port == 0 {
			port = server.RANDOM_PORT
		}
		n.host, n.port = host, port
	}
	for _, r := range cfg.Routes {
		u, err := url.Parse(strings.TrimSpace(r))
		if err != nil || u.Host == "" || (u.Scheme != "nats-route" && u.Scheme != "nats") {
			return nil, fmt.Errorf("cluster route %q: want nats-route://host:port", r)
		}
		n.routes = append(n.routes, u)
	}
	if cfg.Listen != "" && cfg.Trust == nil {
		return nil, fmt.Errorf("cluster listen %s: %w", cfg.Listen, errNoTrust)
	}
	if cfg.Replicas < 0 || cfg.Replicas > 5 {
		return nil, fmt.Errorf("cluster replicas %d: want 1-5", cfg.Replicas)
	}
	return n, nil
}

// routeUser is the user name of route connections.
const routeUser = "beam-route"

// NodeID returns this node's ID.
func (n *Node) NodeID() string { return n.cfg.NodeID }

// Replicas returns the replica count of the cluster's streams.
func (n *Node) Replicas() int {
	if n.cfg.Replicas > 0 {
		return n.cfg.Replicas
	}
	return min(3, 1+len(n.routes))
}

// ServerOptions adds the cluster (routes) and JetStream to the embedded
// NATS server's options. The server name carries the node ID: JetStream
// needs it unique within the cluster. Routes are TLS 1.3 with both sides'
// certificates verified against the cluster CA, and carry the route
// password (trust.go).
func (n *Node) ServerOptions(o *server.Options) {
	o.ServerName = "beam-" + Token(n.cfg.Domain) + "-" + n.cfg.NodeID
	o.JetStream = true
	o.StoreDir = n.cfg.StoreDir
	if n.cfg.Listen != "" {
		t := n.cfg.Trust
		o.Cluster = server.ClusterOpts{Name: "beam-" + Token(n.cfg.Domain), Host: n.host, Port: n.port,
			Username: routeUser, Password: t.secret, TLSConfig: t.tlsConfig(n.cfg.Domain), TLSTimeout: 5}
		routes := make([]*url.URL, len(n.routes))
		for i, u := range n.routes {
			c := *u
			c.User = url.UserPassword(routeUser, t.secret)
			routes[i] = &c
		}
		o.Routes = routes
	}
}

// Start creates (or joins) the cluster's streams through nc, applies the
// registry stream up to its current end — so a node that was down has
// caught up before it serves — keeps applying it in the background, and
// turns on the registry's replication. It waits for the cluster to form
// (JetStream needs a quorum of the replicas) until ctx ends.
func (n *Node) Start(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	n.nc, n.js = nc, js
	name := "BEAM_REGISTRY_" + Token(n.cfg.Domain)
	scfg := jetstream.StreamConfig{
		Name: name, Subjects: []string{n.subj}, Replicas: n.Replicas(),
		Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy,
		MaxMsgSize: 1 << 20, Duplicates: 2 * time.Minute,
	}
	stream, err := n.createStream(ctx, scfg)
	if err != nil {
		return err
	}
	n.stream = stream
	var last uint64
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := stream.Info(attempt)
		cancel()
		if err == nil {
			last = info.State.LastSeq
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: stream %s info: %w", name, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !n.identityChecked {
		if err := n.checkIdentity(ctx, js); err != nil {
			return err
		}
	}
	if n.cfg.Log != nil {
		// A node whose log was taken over must not announce it.
		if err := n.openLogs(ctx); err != nil {
			return err
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = cancel
	if err := n.startMembership(ctx, runCtx, nc); err != nil {
		return err
	}
	if n.cfg.Log != nil {
		// Announced first (startMembership), so no survivor takes the log
		// over while its tail ships; shipped before the registry applier
		// writes to the log.
		if err := n.shipTail(ctx); err != nil {
			_ = n.Close() // leave at once: nothing more is announced for this node
			return err
		}
		n.wg.Add(1)
		go n.watchLogs(runCtx)
	}
	if err := n.startRouting(ctx, runCtx); err != nil {
		return err
	}
	if err := n.startHomes(ctx, runCtx); err != nil {
		return err
	}
	if n.jobsSub, err = nc.Subscribe(n.jobsSubject(n.cfg.NodeID), func(m *nats.Msg) { n.onJobsCall(runCtx, m) }); err != nil {
		return fmt.Errorf("cluster: subscribe jobs calls: %w", err)
	}
	n.wg.Add(1)
	go n.apply(runCtx)
	if err := n.cfg.Registry.WaitApplied(ctx, last); err != nil {
		return fmt.Errorf("cluster: catch up on the registry stream: %w", err)
	}
	if n.cfg.Router != nil {
		n.cfg.Router.replicating.Store(true)
	}
	n.lg.Info("cluster node ready", "registrySeq", last, "replicas", n.Replicas())
	return nil
}

// createStream creates or joins a stream, retrying while the cluster forms
// until ctx ends.
func (n *Node) createStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		stream, err := n.js.CreateOrUpdateStream(attempt, cfg)
		cancel()
		if err == nil {
			return stream, nil
		}
		n.lg.Info("waiting for the cluster to form", "stream", cfg.Name, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: create stream %s: %w", cfg.Name, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// apply feeds the registry stream to the registry in order, from the entry
// after the one it applied last, until ctx ends.
func (n *Node) apply(ctx context.Context) {
	defer n.wg.Done()
	reg := n.cfg.Registry
	for ctx.Err() == nil {
		cons, err := n.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: reg.Applied() + 1,
		})
		if err != nil {
			n.lg.Warn("registry applier: consumer", "err", err)
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		it, err := cons.Messages()
		if err != nil {
			n.lg.Warn("registry applier: messages", "err", err)
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, it.Stop)
		for {
			msg, err := it.Next()
			if err != nil {
				if ctx.Err() == nil {
					n.lg.Warn("registry applier: next", "err", err)
				}
				break
			}
			meta, err := msg.Metadata()
			if err != nil {
				n.lg.Warn("registry applier: metadata", "err", err)
				continue
			}
			seq := meta.Sequence.Stream
			op, verr := n.openEntry(seq, msg.Data())
			for ctx.Err() == nil {
				var err error
				if verr != nil {
					err = reg.Reject(ctx, seq, verr)
				} else {
					err = reg.Apply(ctx, seq, op)
				}
				if err != nil {
					n.lg.Error("registry applier: apply", "seq", seq, "err", err)
					sleep(ctx, 250*time.Millisecond)
					continue
				}
				break
			}
		}
		stop()
		it.Stop()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// Publish appends a registry operation to the stream, sealed by this node
// with the position after (seal.go), if the stream's last entry is still
// after (registry.Replicator). While the stream has no leader (a node died
// and the others elect a new one) it tries again for up to
// publishPatience; the message ID (a digest of the entry, whose operation
// carries a random ID) makes a retry of a publish whose acknowledgement
// was lost a duplicate the stream drops.
func (n *Node) Publish(ctx context.Context, after uint64, op []byte) (uint64, error) {
	tok, err := n.seal(typRegistryEntry, registryEntry{After: after, Op: op})
	if err != nil {
		return 0, err
	}
	change := []byte(tok)
	sum := sha256.Sum256(change)
	id := hex.EncodeToString(sum[:16])
	deadline := time.Now().Add(publishPatience)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := n.js.Publish(actx, n.subj, change, jetstream.WithExpectLastSequence(after), jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return ack.Sequence, nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, fmt.Errorf("cluster: publish after %d: %w", after, registry.ErrStale)
		}
		transient := errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
			errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
		if !transient || ctx.Err() != nil || time.Now().After(deadline) {
			return 0, fmt.Errorf("cluster: publish registry change: %w", err)
		}
		n.lg.Info("registry stream unavailable; retrying", "err", err)
		sleep(ctx, 250*time.Millisecond)
	}
}

// publishPatience bounds how long a registry change waits for the stream
// to have a leader again.
const publishPatience = 20 * time.Second

// Close stops the applier. The NATS connection and server belong to the
// caller.
func (n *Node) Close() error {
	if n.route.sub != nil {
		_ = n.route.sub.Unsubscribe()
	}
	if n.callSub != nil {
		_ = n.callSub.Unsubscribe()
	}
	if n.jobsSub != nil {
		_ = n.jobsSub.Unsubscribe()
	}
	n.streams.close()
	if n.members.sub != nil {
		_ = n.members.sub.Unsubscribe()
	}
	if n.members.kv != nil {
		// Leave at once rather than when the entry expires, so no origin
		// waits for this node.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = n.members.kv.Delete(ctx, n.cfg.NodeID)
		cancel()
	}
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	return nil
}
