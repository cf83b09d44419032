package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Homes: a service that must run on one node at a time (the Intent
// Protocol job bus) has a home, the node that serves it; the others
// forward its requests there (forward.go). The homes bucket
// (BEAM_HOMES_<domain token>, no TTL) holds one key per service, its value
// a JWS by the directory key (typ beam-cluster-home+jws) naming the
// service, the home node and its log, signed as the node that wrote it.
// The first node to start Creates the key; a home moves only by takeover
// (moveHome: an Update at the entry's revision, if the entry still names
// the node taken over). Every node watches the bucket into memory; an
// entry that does not verify is ignored (the last good one stays) and
// counted (kind "home").

// homeJobs is the key of the job bus's home.
const homeJobs = "jobs"

// homeNames are the keys of the homes bucket.
var homeNames = []string{homeJobs}

// typHomeEntry is the typ of a homes bucket entry.
const typHomeEntry = "beam-cluster-home+jws"

// homeEntry is one value of the homes bucket.
type homeEntry struct {
	Name string    `json:"name"` // the key it is stored under
	Node string    `json:"node"` // the home node's ID
	Log  string    `json:"log"`  // the home node's log ID ("" when unknown)
	By   string    `json:"by"`   // the node that wrote it (the signer)
	At   time.Time `json:"at"`
}

// homeInfo is one service's home, as /observability/cluster shows it.
type homeInfo struct {
	// Name is the service ("jobs": the Intent Protocol job bus).
	Name string `json:"name"`
	// Node is the home node's ID.
	Node string `json:"node"`
	// Log is the home node's log ID ("" when unknown).
	Log string `json:"log"`
	// Since is when the home was set.
	Since time.Time `json:"since"`
	// Live says whether the home node's entry is in the nodes bucket.
	Live bool `json:"live"`
}

// homeView is an entry this node took, with its revision.
type homeView struct {
	homeEntry
	rev uint64
}

// homes is the node's part of the homes bucket.
type homes struct {
	kv jetstream.KeyValue

	mu  sync.Mutex
	cur map[string]homeView
	// refreshed is when a request last read the bucket itself (unix ns).
	refreshed atomic.Int64
}

// homeRefreshEvery bounds how often requests read the homes bucket
// themselves while the home this node knows is down.
const homeRefreshEvery = 500 * time.Millisecond

// refreshHome reads name's home from the bucket, at most once per
// homeRefreshEvery: a request that finds its home down does not wait for
// the watch to deliver a move. The watch of a node whose bucket leader
// died with the home's node can lag seconds behind the takeover that
// moved the home (its consumer is recreated first), and the job bus
// would answer 503 all that time.
func (n *Node) refreshHome(ctx context.Context, name string) {
	now, last := time.Now().UnixNano(), n.homes.refreshed.Load()
	if n.homes.kv == nil || now-last < int64(homeRefreshEvery) || !n.homes.refreshed.CompareAndSwap(last, now) {
		return
	}
	gctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	e, err := n.homes.kv.Get(gctx, name)
	if err != nil {
		return
	}
	n.noteHome(e)
}

// startHomes creates the homes bucket, claims the job bus's home when no
// node has (this node serves one), and watches the bucket until runCtx
// ends; it returns once the current entries are in memory.
func (n *Node) startHomes(ctx, runCtx context.Context) error {
	kv, err := createKV(ctx, n.js, jetstream.KeyValueConfig{Bucket: "BEAM_HOMES_" + Token(n.cfg.Domain),
		Replicas: n.Replicas(), Storage: jetstream.FileStorage})
	if err != nil {
		return err
	}
	// Under the lock: the log watch (takeover.go) already reads the homes.
	n.homes.mu.Lock()
	n.homes.kv, n.homes.cur = kv, map[string]homeView{}
	n.homes.mu.Unlock()
	if n.cfg.JobBus {
		tok, err := n.seal(typHomeEntry, n.homeFor(homeJobs, n.cfg.NodeID))
		if err != nil {
			return err
		}
		for {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = kv.Create(cctx, homeJobs, []byte(tok))
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
				break
			}
			n.lg.Info("waiting for the homes bucket", "err", err)
			select {
			case <-ctx.Done():
				return fmt.Errorf("cluster: create home %s: %w", homeJobs, err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	w, err := kv.WatchAll(runCtx)
	if err != nil {
		return fmt.Errorf("cluster: watch homes: %w", err)
	}
	ready := make(chan struct{})
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer func() { _ = w.Stop() }()
		once := sync.OnceFunc(func() { close(ready) })
		defer once()
		for e := range w.Updates() {
			if e == nil {
				once()
				continue
			}
			n.noteHome(e)
		}
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("cluster: read homes: %w", ctx.Err())
	}
}

// homeFor is the entry making node the home of name, written by this node.
func (n *Node) homeFor(name, node string) homeEntry {
	e := homeEntry{Name: name, Node: node, By: n.cfg.NodeID, At: time.Now().UTC()}
	if node == n.cfg.NodeID {
		e.Log = n.cfg.LogID
	}
	return e
}

// homeOf returns the entry e holds if a member sealed it for its key.
func (n *Node) homeOf(e jetstream.KeyValueEntry) (homeEntry, error) {
	var h homeEntry
	err := n.openAs(typHomeEntry, e.Value(), &h, func() string { return h.By })
	if err == nil && h.Name != e.Key() {
		err = fmt.Errorf("%w: home of %q under key %q", errUnsealed, h.Name, e.Key())
	}
	if err == nil && validNodeID(h.Node) != nil {
		err = fmt.Errorf("home of %q names no node", h.Name)
	}
	return h, err
}

// noteHome applies one change of the homes bucket to memory.
func (n *Node) noteHome(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		n.refuse("home", errors.New("home entry deleted"), "key", e.Key())
		return
	}
	h, err := n.homeOf(e)
	if err != nil {
		n.refuse("home", err, "key", e.Key())
		return
	}
	n.setHome(h, e.Revision())
}

// setHome records h, of revision rev, unless a later revision is known
// (moveHome records its own move before the watch delivers it).
func (n *Node) setHome(h homeEntry, rev uint64) {
	n.homes.mu.Lock()
	prev, had := n.homes.cur[h.Name]
	if had && prev.rev >= rev {
		n.homes.mu.Unlock()
		return
	}
	n.homes.cur[h.Name] = homeView{homeEntry: h, rev: rev}
	n.homes.mu.Unlock()
	if prev.Node != h.Node {
		n.lg.Info("home", "name", h.Name, "node", h.Node, "log", h.Log)
	}
}

// home returns the node that is name's home, and whether the node knows
// one.
func (n *Node) home(name string) (string, bool) {
	h, ok := n.homeEntry(name)
	return h.Node, ok
}

// homeEntry returns name's home entry as this node knows it.
func (n *Node) homeEntry(name string) (homeEntry, bool) {
	n.homes.mu.Lock()
	defer n.homes.mu.Unlock()
	h, ok := n.homes.cur[name]
	return h.homeEntry, ok
}

// isHome reports whether this node, with its current log, is name's home.
// A node that started again with a new log (its data directory lost) is
// not: the home's work is in the old log, which a takeover moves, home and
// all, to the node that imports it.
func (n *Node) isHome(name string) bool {
	h, ok := n.homeEntry(name)
	return ok && h.Node == n.cfg.NodeID && (h.Log == "" || h.Log == n.cfg.LogID)
}

// moveHomesOf makes this node the home of every home whose entry names
// logID, the log it just took over and imported.
func (n *Node) moveHomesOf(ctx context.Context, logID string) {
	for _, name := range homeNames {
		h, ok := n.homeEntry(name)
		if !ok || h.Log != logID {
			continue
		}
		if err := n.moveHome(ctx, name, h.Node, n.cfg.NodeID); err != nil {
			n.lg.Warn("move a home taken over", "name", name, "log", logID, "err", err)
		}
	}
}

// isLive reports whether node's entry is in the nodes bucket (as of the
// last refresh of this node's view).
func (n *Node) isLive(node string) bool {
	rt := &n.route
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.live == nil || rt.live[node]
}

// errHomeMoved is the error of a move whose entry no longer names the node
// taken over.
var errHomeMoved = errors.New("cluster: the home moved")

// moveHome makes toNode name's home if the entry still names fromNode: an
// Update at the revision of the entry read, so of two nodes moving the
// same home only one succeeds, and a move based on a stale read fails
// (errHomeMoved).
func (n *Node) moveHome(ctx context.Context, name, fromNode, toNode string) error {
	if n.homes.kv == nil {
		return errors.New("cluster: not started")
	}
	if err := validNodeID(toNode); err != nil {
		return fmt.Errorf("cluster: move home %s: %w", name, err)
	}
	e, err := n.homes.kv.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("cluster: move home %s: %w", name, err)
	}
	h, err := n.homeOf(e)
	if err != nil {
		n.refuse("home", err, "key", name)
		return fmt.Errorf("cluster: move home %s: %w", name, err)
	}
	if h.Node != fromNode {
		return fmt.Errorf("%w: home %s is %s, not %s", errHomeMoved, name, h.Node, fromNode)
	}
	moved := n.homeFor(name, toNode)
	tok, err := n.seal(typHomeEntry, moved)
	if err != nil {
		return err
	}
	rev, err := n.homes.kv.Update(ctx, name, []byte(tok), e.Revision())
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("%w: home %s changed since revision %d", errHomeMoved, name, e.Revision())
	}
	if err != nil {
		return fmt.Errorf("cluster: move home %s: %w", name, err)
	}
	n.setHome(moved, rev)
	n.lg.Info("home moved", "name", name, "from", fromNode, "to", toNode, "revision", rev)
	return nil
}

// homeList is the homes as this node knows them, by name.
func (n *Node) homeList() []homeInfo {
	n.homes.mu.Lock()
	out := make([]homeInfo, 0, len(n.homes.cur))
	for _, h := range n.homes.cur {
		out = append(out, homeInfo{Name: h.Name, Node: h.Node, Log: h.Log, Since: h.At})
	}
	n.homes.mu.Unlock()
	for i := range out {
		out[i].Live = out[i].Node == n.cfg.NodeID || n.isLive(out[i].Node)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
