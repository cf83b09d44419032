package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/tracing"
)

// The cluster chaos run: the mixed load of a chaos run against a cluster
// of three nodes, spread so that every kind of work crosses nodes — the
// senders, envelope creators and job publishers on node 0 (the *owner*:
// it accepts the sends, creates and publishes), the recipients, actors and
// workers on node 1 (the *holder*) and node 2 — while one node, chosen by
// its role, is SIGKILLed, its data directory optionally deleted (keeping
// only what `beam cluster init` wrote), and restarted or left down. Agents
// of the killed node reconnect to a live one. Afterwards the invariants
// are checked from what the agents and workers recorded and what the live
// nodes' HTTP APIs answer (the killed node's log may be gone).

// Kill roles of a cluster chaos run (ClusterChaosConfig.Role).
const (
	// RoleOwner kills the node that accepted the sends, creates and
	// publishes.
	RoleOwner = "owner"
	// RoleHolder kills the node the recipients, actors and workers are
	// connected to.
	RoleHolder = "holder"
	// RoleHome kills the job bus's home node.
	RoleHome = "home"
	// RoleAll runs once per role, in sequence (RunClusterChaosRoles).
	RoleAll = "all"
)

// chaosRoles are the roles a cluster chaos run can kill, in the order
// RoleAll runs them.
var chaosRoles = []string{RoleOwner, RoleHolder, RoleHome}

// Node indices of a cluster chaos run's placement.
const (
	roleOwner  = 0
	roleHolder = 1
	roleThird  = 2
)

// clusterChaosNodes is the size of a cluster chaos run's cluster.
const clusterChaosNodes = 3

// ClusterChaosConfig describes a cluster chaos run.
type ClusterChaosConfig struct {
	// ChaosConfig holds the load's settings; DataDir is the directory the
	// nodes' data directories are made in (node0, node1, node2); Kills is
	// ignored (one kill).
	ChaosConfig
	// Role is the role of the node killed: RoleOwner, RoleHolder or
	// RoleHome.
	Role string
	// DeleteData deletes the killed node's data directory, but for the
	// files `beam cluster init` wrote, before it starts again.
	DeleteData bool
	// NoRestart leaves the killed node down: the cluster must cope.
	NoRestart bool
	// RestartDelay is how long the node stays down before its restart
	// (default 20 s: longer than a node entry's expiry plus the takeover
	// grace, so its work is taken over while it is down).
	RestartDelay time.Duration
	// KillAt is the share of the load after which the node is killed
	// (default 0.4).
	KillAt float64
}

// ClusterChaosReport is the outcome of one cluster chaos run. The
// embedded ChaosReport's Messages counts durable sends by what the
// recipients saw (delivered, lost); its Mix counts jobs and envelopes by
// the status the live nodes answer.
type ClusterChaosReport struct {
	Role string `json:"role"`
	// KilledNode is the node ID of the killed node.
	KilledNode string `json:"killed_node"`
	// DataDeleted, Restarted: what happened to it; Rejoined says the live
	// nodes listed it again, as a member that started after the kill.
	DataDeleted bool `json:"data_deleted"`
	Restarted   bool `json:"restarted"`
	Rejoined    bool `json:"rejoined"`
	// Moved counts the agents that reconnected to another node.
	Moved int `json:"moved_agents"`
	// Placement names, per node, the run's agents connected to it at
	// the start.
	Placement []string `json:"placement"`
	// Notes say what the run could not do as asked (e.g. no home listed).
	Notes []string `json:"notes,omitempty"`
	*ChaosReport
}

// WriteText writes the report as readable text ending in PASS or FAIL.
func (r *ClusterChaosReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster chaos, role %s: killed %s", r.Role, r.KilledNode)
	if r.DataDeleted {
		b.WriteString(", data directory deleted")
	}
	switch {
	case !r.Restarted:
		b.WriteString(", left down")
	case r.Rejoined:
		b.WriteString(", restarted and rejoined as a fresh member")
	default:
		b.WriteString(", restarted but NOT listed again by the other nodes")
	}
	fmt.Fprintf(&b, "; %d agents moved to another node\n", r.Moved)
	for i, p := range r.Placement {
		fmt.Fprintf(&b, "  node%d: %s\n", i, p)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return r.ChaosReport.WriteText(w)
}

// clusterChaos is the cluster side of a chaos run: the nodes, which are
// down, and where each agent and worker goes.
type clusterChaos struct {
	tag    string
	opts   []ServerOptions
	urls   []string
	intent []string // each node's Intent Protocol listener
	keep   string   // where the init files are kept while a node's directory is deleted

	mu    sync.Mutex
	nodes []*ServerProcess
	down  []bool
	// ended caches, while the run settles, the jobs and envelopes a node
	// answered terminal (the final read asks again).
	ended map[string]itemRead
}

// itemRead is a job's or envelope's status as a node answered, and
// for an envelope its trace's terminal steps.
type itemRead struct {
	status string
	ends   int
}

func (c *clusterChaos) nodeURL(i int) string   { return c.urls[i] }
func (c *clusterChaos) intentURL(i int) string { return c.intent[i] }

// live returns node i, or while it is down the next live node.
func (c *clusterChaos) live(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range len(c.down) {
		if j := (i + k) % len(c.down); !c.down[j] {
			return j
		}
	}
	return i
}

// liveNodes returns the nodes that are up.
func (c *clusterChaos) liveNodes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, d := range c.down {
		if !d {
			out = append(out, i)
		}
	}
	return out
}

// place is the node agent i of the kind prefix connects to: senders on
// the owner, online and flaky recipients on the holder, late ones on the
// third node, actors alternating between holder and third.
func (c *clusterChaos) place(prefix string, i int) int {
	switch {
	case strings.HasPrefix(prefix, "sender"):
		return roleOwner
	case strings.HasPrefix(prefix, "late"):
		return roleThird
	case strings.HasPrefix(prefix, "actor"):
		return []int{roleHolder, roleThird}[i%2]
	default:
		return roleHolder
	}
}

// workerNode is the node job worker w claims through.
func (c *clusterChaos) workerNode(w int) int { return []int{roleHolder, roleThird}[w%2] }

// operator returns node i's URL and operator token while it is up.
func (c *clusterChaos) operator(i int) (string, string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down[i] || c.nodes[i] == nil {
		return "", "", false
	}
	return c.nodes[i].URL, c.nodes[i].OperatorToken, true
}

// RunClusterChaos runs one cluster chaos scenario and checks its
// invariants. It returns an error only when the run could not be carried
// out; broken invariants are in the report (ChaosReport.OK).
func RunClusterChaos(ctx context.Context, cfg ClusterChaosConfig) (*ClusterChaosReport, error) {
	if !slices.Contains(chaosRoles, cfg.Role) {
		return nil, fmt.Errorf("chaos: kill role %q: want one of %v", cfg.Role, chaosRoles)
	}
	if cfg.KillAt <= 0 || cfg.KillAt >= 1 {
		cfg.KillAt = 0.4
	}
	if cfg.RestartDelay <= 0 {
		cfg.RestartDelay = 20 * time.Second
	}
	if cfg.Kills == 0 {
		cfg.Kills = 1
	}
	base, err := cfg.ChaosConfig.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.ChaosConfig = base
	lg := cfg.Logger
	tb := make([]byte, 4)
	_, _ = rand.Read(tb)
	// Every message is retried until its recipient, wherever it
	// reconnected, answers: a dead letter would hide a loss.
	r, err := newChaosRun(cfg.ChaosConfig, "1000", &clusterChaos{tag: hex.EncodeToString(tb),
		down: make([]bool, clusterChaosNodes), ended: map[string]itemRead{}})
	if err != nil {
		return nil, err
	}
	defer r.hc.CloseIdleConnections()
	var nodes []*ServerProcess
	for try := 0; ; try++ {
		root := cfg.DataDir
		if try > 0 { // a cluster that never formed: fresh directories
			root = filepath.Join(cfg.DataDir, fmt.Sprintf("retry%d", try))
		}
		if err := r.cl.prepare(root, r.opts); err != nil {
			return nil, err
		}
		nodes, err = startNodes(ctx, r.cl.opts)
		// A free port picked for a node may be taken by another process
		// before the node binds it: pick new ones.
		if err == nil || try == 2 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		lg.Info("chaos: a port was taken before the node bound it; starting again", "err", err)
	}
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	r.cl.nodes = nodes
	for _, n := range nodes {
		r.cl.urls = append(r.cl.urls, n.URL)
	}
	r.url = nodes[roleOwner].URL
	defer func() {
		r.cl.mu.Lock()
		defer r.cl.mu.Unlock()
		for _, n := range r.cl.nodes {
			if n != nil {
				n.Kill()
			}
		}
	}()
	lg.Info("chaos: cluster started", "nodes", r.cl.urls, "role", cfg.Role, "seed", cfg.Seed)
	rep := &ClusterChaosReport{Role: cfg.Role, DataDeleted: cfg.DeleteData, Restarted: !cfg.NoRestart,
		ChaosReport: &ChaosReport{Seed: cfg.Seed, Kills: []ChaosKill{}}}
	victim := roleOwner
	switch cfg.Role {
	case RoleHolder:
		victim = roleHolder
	case RoleHome:
		var note string
		victim, note = r.cl.home(ctx, r.hc)
		if note != "" {
			rep.Notes = append(rep.Notes, note)
		}
	}
	rep.KilledNode = fmt.Sprintf("node%d", victim)

	fl, err := r.newFleet(ctx, "cluster") // the organization of DefaultClusterDomain
	if err != nil {
		return nil, err
	}
	defer fl.close()
	rep.Placement = placementOf(fl.all)
	if err := awaitClusterSessions(ctx, r.hc, r.cl.config(), sessionsOf(slices.Concat(fl.online, fl.flaky))); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}

	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x6368616f73))
	tr := r.startTraffic(ctx, fl, rng)
	defer tr.cancel()
	began := tr.began

	// The killer runs beside the load, which stops after Duration even
	// while the node is still down.
	killAt := time.Duration(cfg.KillAt * float64(cfg.Duration))
	killed := make(chan error, 1)
	go func() {
		if !pause(ctx, time.Until(began.Add(killAt))) {
			killed <- ctx.Err()
			return
		}
		k, moved, rejoined, err := r.cl.killNode(ctx, r, victim, fl.all, cfg)
		rep.Moved, rep.Rejoined = moved, rejoined
		if err == nil {
			k.AtS = round3(killAt.Seconds())
			rep.Kills = append(rep.Kills, k)
			lg.Info("chaos: node killed", "node", victim, "role", cfg.Role, "restart", k.RestartS, "rejoined", rejoined)
		}
		killed <- err
	}()
	var runErr error
	if !pause(ctx, time.Until(began.Add(cfg.Duration))) {
		runErr = ctx.Err()
	}
	tr.endLoad()
	rep.DurationS = round3(time.Since(began).Seconds())
	if err := <-killed; runErr == nil {
		runErr = err
	}
	if runErr != nil {
		return nil, fmt.Errorf("chaos: %w", runErr)
	}
	for _, a := range fl.late {
		if !a.cl().Connected() {
			r.connectLate(ctx, a)
		}
	}

	lg.Info("chaos: load stopped, waiting for the work to settle")
	settleStart := time.Now()
	byID := map[string]*chaosAgent{}
	for _, a := range fl.all {
		byID[a.id.BeamID] = a
	}
	var rec *clusterRecords
	for {
		rec = r.records(ctx, byID, false)
		if rec.settled() || time.Since(settleStart) > cfg.SettleTimeout || ctx.Err() != nil {
			break
		}
		pause(ctx, 500*time.Millisecond)
	}
	rep.Settled = rec.settled()
	rep.SettleS = round3(time.Since(settleStart).Seconds())
	tr.endWork()
	rec = r.records(ctx, byID, true)

	r.count(rep.ChaosReport)
	rep.Invariants = rec.check(rep.ChaosReport)
	return rep, nil
}

// RunClusterChaosRoles runs RunClusterChaos once per role of roles (or
// of chaosRoles for RoleAll), each on a fresh cluster in its own
// subdirectory of cfg.DataDir, and returns every report.
func RunClusterChaosRoles(ctx context.Context, cfg ClusterChaosConfig, role string) ([]*ClusterChaosReport, error) {
	roles := []string{role}
	if role == RoleAll {
		roles = chaosRoles
	}
	var out []*ClusterChaosReport
	root := cfg.DataDir
	for _, ro := range roles {
		c := cfg
		c.Role = ro
		c.DataDir = filepath.Join(root, ro)
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return out, fmt.Errorf("chaos: %w", err)
		}
		rep, err := RunClusterChaos(ctx, c)
		if rep != nil {
			out = append(out, rep)
		}
		if err != nil {
			return out, fmt.Errorf("chaos role %s: %w", ro, err)
		}
	}
	return out, nil
}

// prepare makes the nodes' data directories in root and their options
// (fixed HTTP and Intent Protocol addresses, so a restarted node keeps its
// URLs) and keeps a copy of each node's init files aside.
func (c *clusterChaos) prepare(root string, shared ServerOptions) error {
	dirs := make([]string, clusterChaosNodes)
	for i := range dirs {
		dirs[i] = filepath.Join(root, fmt.Sprintf("node%d", i))
	}
	opts, err := clusterServerOptions(ClusterOptions{Server: shared, DataDirs: dirs})
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	c.keep = filepath.Join(root, "init-files")
	c.intent = nil
	for i := range opts {
		if opts[i].Listen, err = freeLoopbackAddr(); err != nil {
			return err
		}
		intent, err := freeLoopbackAddr()
		if err != nil {
			return err
		}
		c.intent = append(c.intent, "http://"+intent)
		opts[i].Args = append(slices.Clip(opts[i].Args), "--intent-listen", intent)
		if err := copyFiles(dirs[i], filepath.Join(c.keep, fmt.Sprintf("node%d", i)), cluster.InitFiles()); err != nil {
			return err
		}
	}
	c.opts = opts
	return nil
}

// copyFiles copies the files names from directory src to dst (made 0700).
func copyFiles(src, dst string, names []string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			return fmt.Errorf("chaos: keep the cluster files: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dst, n), b, 0o600); err != nil {
			return fmt.Errorf("chaos: keep the cluster files: %w", err)
		}
	}
	return nil
}

// config is the Config of the cluster's live nodes, for
// awaitClusterSessions.
func (c *clusterChaos) config() Config {
	var cfg Config
	for _, i := range c.liveNodes() {
		if u, tok, ok := c.operator(i); ok {
			cfg.NodeURLs, cfg.NodeTokens = append(cfg.NodeURLs, u), append(cfg.NodeTokens, tok)
		}
	}
	return cfg
}

// sessionsOf returns the bench agents of as, for awaitClusterSessions.
func sessionsOf(as []*chaosAgent) []*agent {
	out := make([]*agent, len(as))
	for i, a := range as {
		out[i] = &agent{BeamID: a.id.BeamID}
	}
	return out
}

// placementOf lists, per node, the agents connected to it.
func placementOf(as []*chaosAgent) []string {
	byNode := make([][]string, clusterChaosNodes)
	for _, a := range as {
		n, _ := a.at()
		name, _, _ := strings.Cut(a.id.BeamID, "@")
		byNode[n] = append(byNode[n], name)
	}
	out := make([]string, len(byNode))
	for i, names := range byNode {
		out[i] = strings.Join(names, " ")
	}
	return out
}

// home returns the node the job bus's home is on, read from
// /observability/cluster (the nodes may take a moment to list it after
// they start), or the owner with a note when no node lists it.
func (c *clusterChaos) home(ctx context.Context, hc *http.Client) (int, string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		for i := range c.urls {
			u, tok, ok := c.operator(i)
			if !ok {
				continue
			}
			card, err := clusterStatus(ctx, hc, u, tok)
			if err != nil {
				continue
			}
			if id := homeOf(card); id != "" {
				for j := range c.urls {
					if id == fmt.Sprintf("node%d", j) {
						return j, ""
					}
				}
			}
		}
		if time.Now().After(deadline) || !pause(ctx, 500*time.Millisecond) {
			return roleOwner, "no node lists the job bus's home (GET /observability/cluster status.homes): killing node0, where the job bus's publishes go"
		}
	}
}

// clusterStatus reads GET /observability/cluster of the node at base.
func clusterStatus(ctx context.Context, hc *http.Client, base, token string) (json.RawMessage, error) {
	_, b, err := call(ctx, hc, http.MethodGet, base+"/observability/cluster", nil,
		http.Header{"Authorization": {"Bearer " + token}}, http.StatusOK)
	return b, err
}

// homeOf returns the node ID of the job bus's home in a
// /observability/cluster answer: status.homes as an object keyed by kind
// ({"jobs": {"node": …}}) or a list of {"kind"|"name", "node"|"nodeId"}.
func homeOf(card json.RawMessage) string {
	var c struct {
		Status struct {
			Homes json.RawMessage `json:"homes"`
		} `json:"status"`
	}
	if json.Unmarshal(card, &c) != nil || len(c.Status.Homes) == 0 {
		return ""
	}
	type home struct {
		Kind   string `json:"kind"`
		Name   string `json:"name"`
		Node   string `json:"node"`
		NodeID string `json:"nodeId"`
	}
	pick := func(h home) string { return cmpOr(h.Node, h.NodeID) }
	var byKind map[string]home
	if json.Unmarshal(c.Status.Homes, &byKind) == nil {
		return pick(byKind["jobs"])
	}
	var list []home
	if json.Unmarshal(c.Status.Homes, &list) == nil {
		for _, h := range list {
			if cmpOr(h.Kind, h.Name) == "jobs" {
				return pick(h)
			}
		}
	}
	return ""
}

// cmpOr returns a, or b when a is empty.
func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// killNode SIGKILLs node k, moves the agents connected to it to a live
// node, deletes its data directory but for the init files when asked, and
// restarts it after the delay unless asked not to; then it waits until a
// live node lists it again as a member that started after the kill.
func (c *clusterChaos) killNode(ctx context.Context, r *chaosRun, k int, all []*chaosAgent, cfg ClusterChaosConfig) (ChaosKill, int, bool, error) {
	c.mu.Lock()
	c.nodes[k].Kill()
	c.nodes[k], c.down[k] = nil, true
	c.mu.Unlock()
	killed := time.Now()
	moved, err := r.moveFrom(ctx, k, all)
	if err != nil {
		return ChaosKill{}, moved, false, err
	}
	dir := c.opts[k].DataDir
	if cfg.DeleteData {
		if err := os.RemoveAll(dir); err != nil {
			return ChaosKill{}, moved, false, fmt.Errorf("delete the data directory: %w", err)
		}
		if err := copyFiles(filepath.Join(c.keep, fmt.Sprintf("node%d", k)), dir, cluster.InitFiles()); err != nil {
			return ChaosKill{}, moved, false, err
		}
	}
	if cfg.NoRestart {
		return ChaosKill{}, moved, false, nil
	}
	if !pause(ctx, time.Until(killed.Add(cfg.RestartDelay))) {
		return ChaosKill{}, moved, false, ctx.Err()
	}
	t0 := time.Now()
	var srv *ServerProcess
	for range 5 { // the ports may still be held for a moment
		if srv, err = StartServer(ctx, c.opts[k]); err == nil || ctx.Err() != nil {
			break
		}
		pause(ctx, 500*time.Millisecond)
	}
	if err != nil {
		return ChaosKill{}, moved, false, fmt.Errorf("restart node%d: %w", k, err)
	}
	c.mu.Lock()
	c.nodes[k], c.down[k] = srv, false
	c.mu.Unlock()
	kill := ChaosKill{RestartS: round3(time.Since(t0).Seconds())}
	return kill, moved, c.awaitRejoined(ctx, r.hc, k, killed), nil
}

// awaitRejoined waits (up to a minute) until every other live node lists
// node k as a member that started after since.
func (c *clusterChaos) awaitRejoined(ctx context.Context, hc *http.Client, k int, since time.Time) bool {
	deadline := time.Now().Add(time.Minute)
	id := fmt.Sprintf("node%d", k)
	for _, i := range c.liveNodes() {
		if i == k {
			continue
		}
		for {
			u, tok, ok := c.operator(i)
			if !ok {
				break
			}
			if card, err := clusterStatus(ctx, hc, u, tok); err == nil && listsSince(card, id, since) {
				break
			}
			if time.Now().After(deadline) || !pause(ctx, 200*time.Millisecond) {
				return false
			}
		}
	}
	return true
}

// listsSince reports whether a /observability/cluster answer lists node
// id as started after since.
func listsSince(card json.RawMessage, id string, since time.Time) bool {
	var c struct {
		Status struct {
			Nodes []struct {
				NodeID  string    `json:"nodeId"`
				Started time.Time `json:"started"`
			} `json:"nodes"`
		} `json:"status"`
	}
	if json.Unmarshal(card, &c) != nil {
		return false
	}
	for _, n := range c.Status.Nodes {
		if n.NodeID == id && n.Started.After(since) {
			return true
		}
	}
	return false
}

// moveFrom reconnects every agent connected to node k to a live node (a
// load balancer sending it elsewhere) and returns how many moved.
func (r *chaosRun) moveFrom(ctx context.Context, k int, all []*chaosAgent) (int, error) {
	to := r.cl.live(k)
	moved := 0
	for _, a := range all {
		if n, _ := a.at(); n != k {
			continue
		}
		c, err := r.newClient(a, r.cl.nodeURL(to))
		if err != nil {
			return moved, err
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = c.Connect(cctx)
		cancel()
		if err != nil {
			_ = c.Close()
			return moved, fmt.Errorf("chaos: reconnect %s to node%d: %w", a.id.BeamID, to, err)
		}
		a.mu.Lock()
		old := a.client
		a.client, a.node, a.base = c, to, r.cl.nodeURL(to)
		a.mu.Unlock()
		_ = old.Close()
		moved++
	}
	return moved, nil
}

// clusterRecords are what a cluster chaos run's check reads: what the
// clients were acknowledged and what the agents and workers saw, and the
// terminal status of each job and envelope as the live nodes answer.
type clusterRecords struct {
	// Sent maps every durable nonce tried to its recipient; Acked holds
	// those the bus acknowledged (2xx); Seen the nonces (durable and
	// synchronous) each agent's handler got; Misrouted deliveries whose
	// frame named another recipient.
	Sent      map[string]string
	Acked     map[string]bool
	Seen      map[string]map[string]bool
	Misrouted []string
	// SyncAcked maps each synchronous intent answered with success to
	// its recipient.
	SyncAcked map[string]string
	// Published lists the job IDs whose publish was answered 201;
	// Fulfils counts the fulfils answered 200 per job; Results the result
	// each acknowledged fulfil sent; JobStatus is each published job's
	// status read through a live node ("" when no node answered).
	Published []string
	Fulfils   map[string]int
	JobStatus map[string]string
	// Created lists the envelopes answered 201; EnvStatus and EnvEnds are
	// each one's status and count of terminal steps in its trace, read
	// through a live node's gateway (-1 when unread); Actors is every
	// envelope's route and Ran the actors that ran a hop of it.
	Created   []string
	EnvStatus map[string]string
	EnvEnds   map[string]int
	Actors    []string
	Ran       map[string]map[string]bool
}

// records reads the run's records and asks the live nodes for the status
// of every job and envelope (with fresh unset, only of those not yet
// answered terminal).
func (r *chaosRun) records(ctx context.Context, byID map[string]*chaosAgent, fresh bool) *clusterRecords {
	rec := &clusterRecords{Sent: map[string]string{}, Acked: map[string]bool{}, Seen: map[string]map[string]bool{},
		SyncAcked: map[string]string{}, Fulfils: map[string]int{}, JobStatus: map[string]string{},
		EnvStatus: map[string]string{}, EnvEnds: map[string]int{}, Ran: map[string]map[string]bool{}}
	r.mu.Lock()
	for n, to := range r.attempted {
		rec.Sent[n] = to
	}
	for n := range r.accepted {
		rec.Acked[n] = true
	}
	for a, ns := range r.seen {
		rec.Seen[a] = maps.Clone(ns)
	}
	rec.Misrouted = slices.Clone(r.misrouted)
	r.mu.Unlock()
	m := r.mix
	if m == nil {
		return rec
	}
	m.mu.Lock()
	for n, to := range m.syncAcked {
		rec.SyncAcked[n] = to
	}
	for a, ns := range m.syncSeen {
		if rec.Seen[a] == nil {
			rec.Seen[a] = map[string]bool{}
		}
		for n := range ns {
			rec.Seen[a][n] = true
		}
	}
	for _, id := range m.published {
		rec.Published = append(rec.Published, id)
	}
	for id, n := range m.fulfilled {
		rec.Fulfils[id] = n
	}
	created := map[string]string{}
	for id, by := range m.created {
		rec.Created = append(rec.Created, id)
		created[id] = by
	}
	for id, as := range m.ran {
		rec.Ran[id] = maps.Clone(as)
	}
	for _, a := range m.actors {
		rec.Actors = append(rec.Actors, a.id.BeamID)
	}
	m.mu.Unlock()
	slices.Sort(rec.Published)
	slices.Sort(rec.Created)
	for _, id := range rec.Published {
		if v, ok := r.cl.ended[id]; ok && !fresh {
			rec.JobStatus[id] = v.status
			continue
		}
		rec.JobStatus[id] = r.jobStatus(ctx, id)
		if jobEnded(rec.JobStatus[id]) {
			r.cl.ended[id] = itemRead{status: rec.JobStatus[id]}
		}
	}
	for _, id := range rec.Created {
		if v, ok := r.cl.ended[id]; ok && !fresh {
			rec.EnvStatus[id], rec.EnvEnds[id] = v.status, v.ends
			continue
		}
		st, ends := r.envelopeStatus(ctx, id, byID[created[id]].apiKey)
		rec.EnvStatus[id], rec.EnvEnds[id] = st, ends
		if tracing.MeshStatus(st).Terminal() {
			r.cl.ended[id] = itemRead{st, ends}
		}
	}
	return rec
}

// throughNode picks the live node that answers a read about id: a
// different one for different items, so every node's view is exercised.
func (r *chaosRun) throughNode(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	live := r.cl.liveNodes()
	if len(live) == 0 {
		return 0
	}
	return live[int(h.Sum32()%uint32(len(live)))]
}

// jobStatus reads job id's status through a live node's job bus: "" when
// it does not answer 200.
func (r *chaosRun) jobStatus(ctx context.Context, id string) string {
	base := r.cl.intentURL(r.throughNode(id))
	st, b, err := r.mix.jobs.doAt(ctx, base, http.MethodGet, "/status/"+url.PathEscape(id), "", nil, nil)
	if err != nil || st != http.StatusOK {
		return ""
	}
	var s struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(b, &s)
	return s.Status
}

// envelopeStatus reads envelope id's status and its trace's terminal
// steps through a live node's gateway with its creator's key: "", -1 when
// the node does not answer.
func (r *chaosRun) envelopeStatus(ctx context.Context, id, apiKey string) (string, int) {
	base := r.cl.nodeURL(r.throughNode(id))
	hdr := http.Header{"X-Api-Key": {apiKey}}
	_, b, err := call(ctx, r.hc, http.MethodGet, base+"/api/v1/mesh/"+url.PathEscape(id), nil, hdr, http.StatusOK)
	if err != nil {
		return "", -1
	}
	var v struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(b, &v)
	_, b, err = call(ctx, r.hc, http.MethodGet, base+"/api/v1/mesh/"+url.PathEscape(id)+"/trace", nil, hdr, http.StatusOK)
	if err != nil {
		return v.Status, -1
	}
	var tr struct {
		Events []struct {
			Details struct {
				Mesh json.RawMessage `json:"mesh"`
			} `json:"details"`
		} `json:"events"`
	}
	if json.Unmarshal(b, &tr) != nil {
		return v.Status, -1
	}
	ends := 0
	for _, ev := range tr.Events {
		var st tracing.MeshStep
		if len(ev.Details.Mesh) > 0 && json.Unmarshal(ev.Details.Mesh, &st) == nil && st.Status.Terminal() {
			ends++
		}
	}
	return v.Status, ends
}

// jobEnded reports whether a job status is terminal.
func jobEnded(s string) bool { return s == tracing.JobFulfilled || s == tracing.JobDead }

// settled reports whether the run's work is done: every acknowledged
// durable send seen by its recipient, every published job and every
// created envelope terminal.
func (rec *clusterRecords) settled() bool {
	for n := range rec.Acked {
		if !rec.Seen[rec.Sent[n]][n] {
			return false
		}
	}
	for _, id := range rec.Published {
		if !jobEnded(rec.JobStatus[id]) {
			return false
		}
	}
	for _, id := range rec.Created {
		if !tracing.MeshStatus(rec.EnvStatus[id]).Terminal() {
			return false
		}
	}
	return true
}

// check returns the cluster run's invariants and counts what it checked
// into rep.
func (rec *clusterRecords) check(rep *ChaosReport) []*Invariant {
	rep.Messages = map[string]int64{}
	a := &Invariant{Name: "(a) every acknowledged durable send reached its recipient (0 lost)"}
	for _, n := range slices.Sorted(maps.Keys(rec.Acked)) {
		a.Checked++
		if to := rec.Sent[n]; !rec.Seen[to][n] {
			rep.Messages["lost"]++
			a.violate("nonce %s was acknowledged but %s never got it", n, to)
		} else {
			rep.Messages["delivered"]++
		}
	}
	c := &Invariant{Name: "(c) no agent saw a message it was not sent"}
	for _, who := range slices.Sorted(maps.Keys(rec.Seen)) {
		for n := range rec.Seen[who] {
			c.Checked++
			if to, ok := rec.Sent[n]; ok && to != who {
				c.violate("%s saw nonce %s sent to %s", who, n, to)
			} else if _, sync := rec.SyncAcked[n]; !ok && !sync && strings.HasPrefix(n, "chaos-") {
				c.violate("%s saw nonce %s that no one sent", who, n)
			}
		}
	}
	for _, m := range rec.Misrouted {
		c.violate("%s", m)
	}
	e := &Invariant{Name: "(e) every acknowledged synchronous intent reached its recipient"}
	for _, n := range slices.Sorted(maps.Keys(rec.SyncAcked)) {
		e.Checked++
		if to := rec.SyncAcked[n]; !rec.Seen[to][n] {
			e.violate("intent %s was answered but %s never got it", n, to)
		}
	}
	f := &Invariant{Name: "(f) no job fulfilled twice; every published job ends fulfilled or dead, read through any node"}
	for _, id := range slices.Sorted(maps.Keys(rec.Fulfils)) {
		if n := rec.Fulfils[id]; n > 1 {
			f.violate("job %s: %d fulfils answered 200", id, n)
		}
	}
	if rep.Mix != nil {
		rep.Mix.JobsLog = map[string]int64{}
		rep.Mix.Envelopes = map[string]int64{}
	}
	for _, id := range rec.Published {
		f.Checked++
		st := rec.JobStatus[id]
		if rep.Mix != nil {
			rep.Mix.JobsLog[cmpOr(st, "unknown")]++
		}
		switch {
		case st == "":
			f.violate("published job %s: no live node knows it", id)
		case !jobEnded(st):
			f.violate("published job %s ended %s", id, st)
		case rec.Fulfils[id] > 0 && st != tracing.JobFulfilled:
			f.violate("job %s: fulfil answered 200, the cluster says %s", id, st)
		}
	}
	g := &Invariant{Name: "(g) every created envelope finishes exactly once, read through any node's gateway"}
	for _, id := range rec.Created {
		g.Checked++
		st, ends := rec.EnvStatus[id], rec.EnvEnds[id]
		if rep.Mix != nil {
			rep.Mix.Envelopes[cmpOr(st, "unknown")]++
		}
		switch {
		case st == "":
			g.violate("envelope %s: no live node knows it", id)
		case !tracing.MeshStatus(st).Terminal():
			g.violate("envelope %s ended %s", id, st)
		case ends != 1:
			g.violate("envelope %s ended %s after %d terminal steps in its trace", id, st, ends)
		case st == string(tracing.MeshSucceeded):
			for _, actor := range rec.Actors {
				if !rec.Ran[id][actor] {
					g.violate("envelope %s succeeded but %s never ran its hop", id, actor)
				}
			}
		}
	}
	return []*Invariant{a, c, e, f, g}
}

// errNoRole is returned for an unknown --chaos-kill-role.
var errNoRole = errors.New("chaos: unknown kill role")

// CheckChaosRole returns nil for a role RunClusterChaosRoles takes.
func CheckChaosRole(role string) error {
	if role == RoleAll || slices.Contains(chaosRoles, role) {
		return nil
	}
	return fmt.Errorf("%w %q: want one of %v or %s", errNoRole, role, chaosRoles, RoleAll)
}
