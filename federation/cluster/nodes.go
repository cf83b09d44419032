package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Membership: every node keeps an entry in the nodes bucket
// (BEAM_NODES_<domain token>, a JetStream KV bucket with a TTL) refreshed
// while it runs, and answers sync requests on its own subject: a request
// carrying a registry stream sequence is answered once the node applied it.
// The origin of a registry change asks every live node before it answers
// its client, so a change acknowledged to a client (a key revocation) holds
// on every node that serves.

// Defaults of the membership.
const (
	nodeTTL        = 10 * time.Second
	nodeRefresh    = 2 * time.Second
	settleTimeout  = 3 * time.Second
	maxSettle      = 30 * time.Second
	maxSyncPayload = 32
)

// NodeInfo is one node's entry in the nodes bucket.
type NodeInfo struct {
	// NodeID names the node.
	NodeID string `json:"nodeId"`
	// URL is the node's HTTP base URL ("" until it serves), for display:
	// nodes call each other over NATS (busproxy.go).
	URL string `json:"url,omitempty"`
	// Started is when the node joined.
	Started time.Time `json:"started"`
	// Seen is when the node last refreshed its entry.
	Seen time.Time `json:"seen"`
	// RegistrySeq is the registry stream position the node applied.
	RegistrySeq uint64 `json:"registrySeq"`
	// Sessions is the number of WebSocket sessions the node holds.
	Sessions int `json:"sessions"`
	// LogID is the ID of the node's event log, shipped to the log stream
	// (logship.go): while a live node announces it, nobody takes it over.
	LogID string `json:"logId,omitempty"`
}

// membership is the node's part of the nodes bucket.
type membership struct {
	kv  jetstream.KeyValue
	sub *nats.Subscription

	mu      sync.Mutex
	url     string
	started time.Time
}

func (n *Node) syncSubject(nodeID string) string {
	return "beam.cluster." + Token(n.cfg.Domain) + ".node." + nodeID + ".sync"
}

// startMembership creates the nodes bucket, answers sync requests and keeps
// this node's entry fresh until ctx ends.
func (n *Node) startMembership(ctx, runCtx context.Context, nc *nats.Conn) error {
	kv, err := createKV(ctx, n.js, jetstream.KeyValueConfig{
		Bucket: "BEAM_NODES_" + Token(n.cfg.Domain), TTL: nodeTTL, Replicas: n.Replicas(),
		Storage: jetstream.FileStorage,
	})
	if err != nil {
		return err
	}
	n.members.kv = kv
	n.members.started = time.Now().UTC()
	sub, err := nc.Subscribe(n.syncSubject(n.cfg.NodeID), func(m *nats.Msg) {
		if len(m.Data) > maxSyncPayload {
			return
		}
		seq, err := strconv.ParseUint(string(m.Data), 10, 64)
		if err != nil {
			return
		}
		go func() {
			wctx, cancel := context.WithTimeout(runCtx, settleTimeout)
			defer cancel()
			if n.cfg.Registry.WaitApplied(wctx, seq) == nil {
				_ = m.Respond([]byte("ok"))
			}
		}()
	})
	if err != nil {
		return fmt.Errorf("cluster: subscribe sync: %w", err)
	}
	n.members.sub = sub
	n.announce(ctx)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(nodeRefresh)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				n.announce(runCtx)
			}
		}
	}()
	return nil
}

// createKV creates or joins a KV bucket, retrying while the cluster forms.
func createKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err := js.CreateOrUpdateKeyValue(attempt, cfg)
		cancel()
		if err == nil {
			return kv, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: create bucket %s: %w", cfg.Bucket, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// announce writes this node's entry.
func (n *Node) announce(ctx context.Context) {
	n.members.mu.Lock()
	info := NodeInfo{NodeID: n.cfg.NodeID, URL: n.members.url, Started: n.members.started,
		Seen: time.Now().UTC(), RegistrySeq: n.cfg.Registry.Applied()}
	n.members.mu.Unlock()
	if n.cfg.Log != nil && !n.isFenced() {
		info.LogID = n.cfg.Log.ID()
	}
	if sessions := n.cfg.Sessions; sessions != nil {
		info.Sessions = sessions()
	}
	tok, err := n.seal(typNodeEntry, info)
	if err != nil {
		n.lg.Warn("announce node", "err", err)
		return
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := n.members.kv.Put(actx, n.cfg.NodeID, []byte(tok)); err != nil && ctx.Err() == nil {
		n.lg.Warn("announce node", "err", err)
	}
	if nodes, err := n.Nodes(actx); err == nil {
		n.setLive(nodes)
	}
}

// SetURL records the HTTP base URL this node serves on, shown to the other
// nodes and the dashboard (display only: node calls go over NATS).
func (n *Node) SetURL(url string) {
	n.members.mu.Lock()
	n.members.url = url
	kv := n.members.kv
	n.members.mu.Unlock()
	if kv != nil {
		// The others learn the address now rather than at the next refresh.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		n.announce(ctx)
		cancel()
	}
}

// maxEntryAge bounds how old a node entry's Seen may be: a node refreshes
// its entry every nodeRefresh, so an older one is a copy put back (a
// minute more covers clocks that differ between machines).
const maxEntryAge = nodeTTL + time.Minute

// nodeOf returns the node entry e holds if a member of the cluster signed
// it (seal.go) for the node whose key it is stored under, recently;
// anything else is refused and counted.
func (n *Node) nodeOf(e jetstream.KeyValueEntry) (NodeInfo, bool) {
	var info NodeInfo
	err := n.openAs(typNodeEntry, e.Value(), &info, func() string { return info.NodeID })
	if err == nil && info.NodeID != e.Key() {
		err = fmt.Errorf("entry of %s under key %s", info.NodeID, e.Key())
	}
	if age := time.Since(info.Seen); err == nil && (age > maxEntryAge || age < -maxEntryAge) {
		err = fmt.Errorf("entry of %s seen at %s", info.NodeID, info.Seen.Format(time.RFC3339))
	}
	if err != nil {
		n.refuse("node", err, "key", e.Key())
		return NodeInfo{}, false
	}
	return info, true
}

// Nodes returns the live nodes of the cluster (their entries have not
// expired), by node ID.
func (n *Node) Nodes(ctx context.Context) ([]NodeInfo, error) {
	if n.members.kv == nil {
		return nil, errors.New("cluster: not started")
	}
	lister, err := n.members.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: list nodes: %w", err)
	}
	var out []NodeInfo
	for key := range lister.Keys() {
		e, err := n.members.kv.Get(ctx, key)
		if err != nil {
			continue
		}
		if info, ok := n.nodeOf(e); ok {
			out = append(out, info)
		}
	}
	_ = lister.Stop()
	sort.Slice(out, func(i, j int) bool { return out[i].NodeID < out[j].NodeID })
	return out, nil
}

// Settle waits until every other live node applied the registry stream up
// to seq. A node that is slow to confirm is asked again for as long as it
// stays a member (it refreshes its entry while it runs), up to maxSettle; a
// node that has no subscriber (its process or NATS connection is gone) or
// whose entry expired is down and catches up before it serves again.
func (n *Node) Settle(ctx context.Context, seq uint64) {
	nodes, err := n.Nodes(ctx)
	if err != nil {
		n.lg.Warn("settle registry change", "seq", seq, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, maxSettle)
	defer cancel()
	var wg sync.WaitGroup
	for _, info := range nodes {
		if info.NodeID == n.cfg.NodeID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.settleNode(ctx, info, seq); err != nil {
				n.lg.Warn("node did not confirm a registry change", "peer", info.NodeID, "seq", seq, "err", err)
			}
		}()
	}
	wg.Wait()
}

// settleNode asks one node to confirm seq until it does, leaves the
// membership or restarts, or ctx ends.
func (n *Node) settleNode(ctx context.Context, info NodeInfo, seq uint64) error {
	payload := []byte(strconv.FormatUint(seq, 10))
	for {
		rctx, cancel := context.WithTimeout(ctx, settleTimeout)
		_, err := n.nc.RequestWithContext(rctx, n.syncSubject(info.NodeID), payload)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, nats.ErrNoResponders):
			return nil // not subscribed: down
		case ctx.Err() != nil, errors.Is(err, nats.ErrConnectionClosed):
			return err
		}
		e, gerr := n.members.kv.Get(ctx, info.NodeID)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted) {
			return nil // expired: down
		}
		if gerr == nil {
			if now, ok := n.nodeOf(e); ok && !now.Started.Equal(info.Started) {
				return nil // restarted: it caught up before serving
			}
		}
		n.lg.Info("node slow to confirm a registry change; asking again", "peer", info.NodeID, "seq", seq, "err", err)
	}
}

// status is what the dashboard shows of the cluster.
type status struct {
	// Node is this node's ID.
	Node string `json:"node"`
	// Domain is the domain the cluster serves.
	Domain string `json:"domain"`
	// Replicas of the cluster's streams.
	Replicas int `json:"replicas"`
	// RegistrySeq is the registry stream position this node applied.
	RegistrySeq uint64 `json:"registrySeq"`
	// Nodes are the live nodes.
	Nodes []NodeInfo `json:"nodes"`
	// Sessions say which node holds each connected agent's session.
	Sessions []sessionInfo `json:"sessions"`
	// Homes are the nodes serving the services that run on one node.
	Homes []homeInfo `json:"homes"`
	// Takeovers are the logs of lost nodes taken over, the latest first.
	Takeovers []takeoverRecord `json:"takeovers"`
}

// sessionInfo is one agent's session and the node holding it.
type sessionInfo struct {
	BeamID string `json:"beamId"`
	Node   string `json:"node"`
}

// Status returns the cluster's nodes and where each agent is connected.
func (n *Node) Status(ctx context.Context) (any, error) {
	nodes, err := n.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	st := status{Node: n.cfg.NodeID, Domain: n.cfg.Domain, Replicas: n.Replicas(),
		RegistrySeq: n.cfg.Registry.Applied(), Nodes: nodes, Sessions: []sessionInfo{}, Homes: n.homeList()}
	for id, node := range n.Sessions() {
		st.Sessions = append(st.Sessions, sessionInfo{BeamID: id, Node: node})
	}
	sort.Slice(st.Sessions, func(i, j int) bool { return st.Sessions[i].BeamID < st.Sessions[j].BeamID })
	if st.Takeovers, err = n.takeoverList(ctx); err != nil {
		return nil, err
	}
	return st, nil
}
