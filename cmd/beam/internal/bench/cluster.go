package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/beamdir/beam/federation/cluster"
)

// DefaultClusterDomain is the domain of the nodes StartCluster starts and
// of a cluster run's agents.
const DefaultClusterDomain = "cluster.beam.directory"

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// Server holds what every node shares (Binary, Synchronous, Args,
	// Output, StartTimeout); its DataDir and Listen are ignored.
	Server ServerOptions
	// DataDirs are the nodes' data directories, one per node (at least
	// two). Unless each already holds a cluster's route credentials,
	// they are made as beam cluster init does (cluster.WriteNodeDirs):
	// one directory key, the route password and node certificates.
	DataDirs []string
	// Domain is the cluster's domain (DefaultClusterDomain).
	Domain string
}

// ClusterNodeArgs returns the beam serve flags of node i of a cluster of
// domain whose embedded NATS servers route to each other on routes (one
// loopback address per node): --cluster, its node id, route listener and
// the routes to the other nodes, and --default-policy allow. The route
// credentials are in the node's data directory (InitClusterDirs).
func ClusterNodeArgs(i int, routes []string, domain string) []string {
	var others []string
	for j, r := range routes {
		if j != i {
			others = append(others, "nats-route://"+r)
		}
	}
	return []string{"--domain", domain, "--cluster",
		"--node-id", fmt.Sprintf("node%d", i), "--nats-listen", "127.0.0.1:0",
		"--cluster-listen", routes[i], "--cluster-routes", strings.Join(others, ","),
		"--default-policy", "allow"}
}

// InitClusterDirs makes dirs the data directories of one cluster of domain
// (cluster.WriteNodeDirs), unless every one of them holds route
// credentials already (a data directory kept from an earlier run).
func InitClusterDirs(domain string, dirs []string) error {
	ready := true
	for _, d := range dirs {
		if _, err := cluster.LoadTrust(d); err != nil {
			ready = false
		}
	}
	if ready {
		return nil
	}
	return cluster.WriteNodeDirs(domain, dirs)
}

// ClusterModes are the modes Run serves on a cluster (Config.NodeURLs);
// RunJobs serves ModeJobs on one (JobsConfig.WorkerURLs).
var ClusterModes = []Mode{ModeWS, ModeHTTP, modeBus, modeMesh}

// StartCluster starts one `beam serve --cluster` process per data
// directory, all of one domain, their embedded NATS servers routed to each
// other on free loopback ports. The nodes start together (the cluster's
// streams need a quorum); it returns once every node serves, or stops them
// all on the first failure.
func StartCluster(ctx context.Context, opts ClusterOptions) ([]*ServerProcess, error) {
	all, err := clusterServerOptions(opts)
	if err != nil {
		return nil, err
	}
	return startNodes(ctx, all)
}

// clusterServerOptions makes opts' data directories a cluster's
// (InitClusterDirs) and returns each node's ServerOptions, the routes on
// free loopback ports.
func clusterServerOptions(opts ClusterOptions) ([]ServerOptions, error) {
	n := len(opts.DataDirs)
	if n < 2 {
		return nil, fmt.Errorf("start cluster: %d data directories, want at least 2", n)
	}
	if opts.Domain == "" {
		opts.Domain = DefaultClusterDomain
	}
	if err := InitClusterDirs(opts.Domain, opts.DataDirs); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	routes := make([]string, n)
	for i := range routes {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
		routes[i] = addr
	}
	out := make([]ServerOptions, n)
	for i, dir := range opts.DataDirs {
		o := opts.Server
		o.DataDir, o.Listen = dir, ""
		o.Args = append(ClusterNodeArgs(i, routes, opts.Domain), o.Args...)
		out[i] = o
	}
	return out, nil
}

// startNodes starts one process per entry of opts, together, and returns
// once every one serves, or stops them all on the first failure.
func startNodes(ctx context.Context, opts []ServerOptions) ([]*ServerProcess, error) {
	nodes := make([]*ServerProcess, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = StartServer(ctx, o)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		StopAll(nodes)
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	return nodes, nil
}

// StopAll stops every started process of ps (nil entries are skipped) and
// returns their errors joined.
func StopAll(ps []*ServerProcess) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, p := range ps {
		if p != nil {
			errs = append(errs, p.Stop(ctx))
		}
	}
	return errors.Join(errs...)
}

// nodeFigures are one cluster node's figures of a run.
type nodeFigures struct {
	URL string `json:"url"`
	PID int    `json:"pid"`
	// Senders and Recipients are how many of the run's agents connect to
	// the node.
	Senders    int `json:"senders"`
	Recipients int `json:"recipients"`
	// ServerCPUmsPerIntent is the node's CPU over the measured phase per
	// intent of the whole run; null when its process could not be read.
	ServerCPUmsPerIntent *float64 `json:"server_cpu_ms_per_intent"`
	ServerRSSMB          *float64 `json:"server_rss_mb"`
}

// sampleNodes reads every node's process; a node that cannot be read has a
// zero sample and a note.
func sampleNodes(pids []int, sum *Summary) []procSample {
	out := make([]procSample, len(pids))
	for i, pid := range pids {
		s, err := readProc(pid)
		if err != nil {
			sum.Notes = append(sum.Notes, fmt.Sprintf("cluster node %d: %v", i, err))
			continue
		}
		out[i] = s
	}
	return out
}

// setCluster sets the per-node figures and the server figures summed over
// the nodes from samples taken before and after the measured phase.
func (s *Summary) setCluster(cfg Config, f *fleet, before, after []procSample, intents int64) {
	s.ClusterNodes = make([]nodeFigures, len(cfg.NodeURLs))
	var cpu time.Duration
	var hwm int64
	measured := len(cfg.NodePIDs) > 0
	for i, u := range cfg.NodeURLs {
		nf := nodeFigures{URL: u}
		for _, a := range f.Senders {
			if a.Base == u {
				nf.Senders++
			}
		}
		for _, a := range f.Recipients {
			if a.Base == u {
				nf.Recipients++
			}
		}
		if i < len(cfg.NodePIDs) {
			nf.PID = cfg.NodePIDs[i]
		}
		if i < len(before) && !before[i].At.IsZero() && !after[i].At.IsZero() {
			d := after[i].CPU - before[i].CPU
			cpu += d
			hwm += after[i].HWM
			if intents > 0 {
				v := round3(float64(d) / float64(time.Millisecond) / float64(intents))
				nf.ServerCPUmsPerIntent = &v
			}
			r := mb(after[i].HWM)
			nf.ServerRSSMB = &r
		} else {
			measured = false
		}
		s.ClusterNodes[i] = nf
	}
	if !measured {
		return
	}
	if intents > 0 {
		v := round3(float64(cpu) / float64(time.Millisecond) / float64(intents))
		s.ServerCPUmsPerIntent = &v
	}
	if wall := after[0].At.Sub(before[0].At); wall > 0 {
		v := math.Round(float64(cpu)/float64(wall)*1000) / 1000
		s.ServerCPUUtil = &v
	}
	r := mb(hwm)
	s.ServerRSSMB = &r
}

// awaitClusterSessions waits until every node of cfg's cluster lists every
// recipient's session (GET /observability/cluster with the node's operator
// token): a node learns of sessions other nodes hold through a replicated
// bucket, and an intent sent before it did would be answered OFFLINE.
// Without tokens (a cluster the bench did not start) it does not wait.
func awaitClusterSessions(ctx context.Context, hc *http.Client, cfg Config, recipients []*agent) error {
	if len(cfg.NodeTokens) != len(cfg.NodeURLs) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i, base := range cfg.NodeURLs {
		for {
			held, err := clusterSessions(ctx, hc, base, cfg.NodeTokens[i])
			if err == nil && holdsAll(held, recipients) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("bench: node %s does not list every recipient's session: %v", base, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// clusterSessions returns the agents whose sessions the node at base lists.
func clusterSessions(ctx context.Context, hc *http.Client, base, token string) (map[string]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/observability/cluster", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /observability/cluster: %s", resp.Status)
	}
	var card struct {
		Status struct {
			Sessions []struct {
				BeamID string `json:"beamId"`
			} `json:"sessions"`
		} `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&card); err != nil {
		return nil, fmt.Errorf("GET /observability/cluster: %w", err)
	}
	out := map[string]bool{}
	for _, s := range card.Status.Sessions {
		out[s.BeamID] = true
	}
	return out, nil
}

// holdsAll reports whether held lists every agent of as.
func holdsAll(held map[string]bool, as []*agent) bool {
	for _, a := range as {
		if !held[a.BeamID] {
			return false
		}
	}
	return true
}

// ratios are a cluster run's figures divided by the same run's on one
// node (beam bench --compare-single): above 1 the cluster is faster
// (throughput), slower (latency) or costlier (CPU per operation). A ratio
// is null when either figure is missing or zero.
type ratios struct {
	Throughput       *float64 `json:"throughput"`
	P99              *float64 `json:"p99"`
	ServerCPUPerOp   *float64 `json:"server_cpu_per_op"`
	PublishPerSecond *float64 `json:"publish_per_second,omitempty"`
}

// ratio is a/b rounded to 0.001, nil when either is missing or b is zero.
func ratio(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	v := round3(*a / *b)
	return &v
}

// CompareSingle records single, the same run on one node, in s (a
// cluster run) with the ratios of their figures.
func (s *Summary) CompareSingle(single *Summary) {
	s.SingleNode = single
	s.VsSingleNode = &ratios{
		Throughput:     ratio(&s.IntentsPerSecond, &single.IntentsPerSecond),
		P99:            ratio(&s.P99ms, &single.P99ms),
		ServerCPUPerOp: ratio(s.ServerCPUmsPerIntent, single.ServerCPUmsPerIntent),
	}
}

// CompareSingle records single, the same jobs run on one node, in s (a
// cluster run) with the ratios of their figures.
func (s *JobsSummary) CompareSingle(single *JobsSummary) {
	s.SingleNode = single
	s.VsSingleNode = &ratios{
		Throughput:       ratio(&s.JobsPerSecond, &single.JobsPerSecond),
		P99:              ratio(&s.ClaimP99ms, &single.ClaimP99ms),
		ServerCPUPerOp:   ratio(s.ServerCPUmsPerJob, single.ServerCPUmsPerJob),
		PublishPerSecond: ratio(&s.PublishPerSecond, &single.PublishPerSecond),
	}
}

// String is the ratios as one line of the table.
func (r *ratios) String() string {
	f := func(v *float64) string {
		if v == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.2f×", *v)
	}
	out := fmt.Sprintf("cluster vs one node: throughput %s, p99 %s, server cpu per op %s", f(r.Throughput), f(r.P99), f(r.ServerCPUPerOp))
	if r.PublishPerSecond != nil {
		out += ", publish/s " + f(r.PublishPerSecond)
	}
	return out
}
