package bench

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ModeJobs is the Intent Protocol job bus: publishers POST /intent, workers
// POST /claim then /fulfill, over HTTP, HMAC-signed like the Python SDK.
// It has its own runner (RunJobs), not a Driver.
const ModeJobs Mode = "jobs"

// JobsConfig configures RunJobs.
type JobsConfig struct {
	// URL is the Intent Protocol listener's base URL; Key an API key.
	URL, Key string
	// Count is the number of jobs published and then drained.
	Count int
	// Publishers and Workers are the concurrent clients of each phase.
	Publishers, Workers int
	// Sign signs every request (X-Timestamp, X-Nonce, X-Signature).
	Sign bool
	// PayloadBytes is the filler size of each payload.
	PayloadBytes int
	// ServerPID is read for CPU and RSS (0: not measured).
	ServerPID int
	// WorkerURLs, when set, are the Intent Protocol listeners of other
	// nodes of URL's cluster: workers claim and fulfil through them
	// (round-robin), so every job crosses from the node that accepted its
	// publish to another.
	WorkerURLs []string
	// NodeURLs and NodePIDs are the cluster's nodes and their processes
	// (same order), read for CPU per operation summed over the nodes and
	// per node; ServerPID is then ignored.
	NodeURLs []string
	NodePIDs []int
	// Logger receives progress.
	Logger *slog.Logger
}

// JobsSummary is the result of a jobs run.
type JobsSummary struct {
	Mode       Mode `json:"mode"`
	Count      int  `json:"count"`
	Publishers int  `json:"publishers"`
	Workers    int  `json:"workers"`
	Signed     bool `json:"signed"`

	Published        int64   `json:"published"`
	PublishElapsedS  float64 `json:"publish_elapsed_s"`
	PublishPerSecond float64 `json:"publish_per_second"`
	PublishP50ms     float64 `json:"publish_p50_ms"`
	PublishP99ms     float64 `json:"publish_p99_ms"`

	Fulfilled      int64   `json:"fulfilled"`
	DrainElapsedS  float64 `json:"drain_elapsed_s"`
	JobsPerSecond  float64 `json:"jobs_per_second"`
	ClaimP50ms     float64 `json:"claim_p50_ms"`
	ClaimP99ms     float64 `json:"claim_p99_ms"`
	FulfillP50ms   float64 `json:"fulfill_p50_ms"`
	FulfillP99ms   float64 `json:"fulfill_p99_ms"`
	DuplicateJobs  int64   `json:"duplicate_claims"`
	DuplicateFulfl int64   `json:"duplicate_fulfills"`

	Errors     int64            `json:"errors"`
	ErrorCodes map[string]int64 `json:"error_codes,omitempty"`

	ServerCPUmsPerPublish *float64 `json:"server_cpu_ms_per_publish"`
	ServerCPUmsPerJob     *float64 `json:"server_cpu_ms_per_job"`
	ServerCPUCoresDrain   *float64 `json:"server_cpu_cores_drain,omitempty"`
	ServerRSSMB           *float64 `json:"server_rss_mb"`
	// Ed25519VerifyMs is the run's own floor (see Summary); jobs are
	// HMAC-signed, so it only puts the per-job cost on the same scale.
	Ed25519VerifyMs   *float64 `json:"ed25519_verify_ms"`
	ServerCPUVerifies *float64 `json:"server_cpu_verifies_per_job,omitempty"`
	// ClusterNodes (a cluster run) has one entry per node; the server
	// figures above are then summed over the nodes.
	ClusterNodes []jobsNodeFigures `json:"cluster_nodes,omitempty"`
	// SingleNode and VsSingleNode are the same run on one node and the
	// cluster's figures relative to it (beam bench --compare-single).
	SingleNode   *JobsSummary `json:"single_node,omitempty"`
	VsSingleNode *ratios      `json:"vs_single_node,omitempty"`
	Notes        []string     `json:"notes,omitempty"`
}

// jobsNodeFigures are one cluster node's figures of a jobs run.
type jobsNodeFigures struct {
	URL                   string   `json:"url"`
	PID                   int      `json:"pid"`
	ServerCPUmsPerPublish *float64 `json:"server_cpu_ms_per_publish"`
	ServerCPUmsPerJob     *float64 `json:"server_cpu_ms_per_job"`
}

type jobsClient struct {
	cfg  JobsConfig
	http *http.Client
	mu   sync.Mutex
	errs map[string]int64
	nerr atomic.Int64
}

func (c *jobsClient) fail(code string) {
	c.nerr.Add(1)
	c.mu.Lock()
	c.errs[code]++
	c.mu.Unlock()
}

// do sends one request, signed like the SDK, with the extra headers hdr,
// and returns status and body.
func (c *jobsClient) do(ctx context.Context, method, path, query string, body []byte, hdr http.Header) (int, []byte, error) {
	return c.doAt(ctx, c.cfg.URL, method, path, query, body, hdr)
}

// doAt is do against the listener at base.
func (c *jobsClient) doAt(ctx context.Context, base, method, path, query string, body []byte, hdr http.Header) (int, []byte, error) {
	u := base + path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-KEY", c.cfg.Key)
	if c.cfg.Sign {
		var nb [16]byte
		_, _ = rand.Read(nb[:])
		nonce := hex.EncodeToString(nb[:])
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		p := path
		if query != "" {
			p += "?" + query
		}
		m := hmac.New(sha256.New, []byte(c.cfg.Key))
		m.Write([]byte(method + "\n" + p + "\n" + ts + "\n" + nonce + "\n"))
		m.Write(body)
		req.Header.Set("X-Timestamp", ts)
		req.Header.Set("X-Nonce", nonce)
		req.Header.Set("X-Signature", hex.EncodeToString(m.Sum(nil)))
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxResponse))
	return res.StatusCode, b, err
}

// RunJobs publishes Count jobs with Publishers clients, then drains them
// with Workers clients (claim, then fulfill), and reports both rates, the
// claim latency and the server's CPU per job.
func RunJobs(ctx context.Context, cfg JobsConfig) (*JobsSummary, error) {
	if cfg.URL == "" || cfg.Key == "" || cfg.Count <= 0 {
		return nil, errors.New("jobs bench: URL, Key and a positive Count are required")
	}
	cfg.Publishers = max(cfg.Publishers, 1)
	cfg.Workers = max(cfg.Workers, 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	conns := cfg.Publishers + cfg.Workers
	c := &jobsClient{cfg: cfg, errs: map[string]int64{}, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}}
	defer c.http.CloseIdleConnections()
	var nb [4]byte
	_, _ = rand.Read(nb[:])
	ns := "bench-" + hex.EncodeToString(nb[:])
	sum := &JobsSummary{Mode: ModeJobs, Count: cfg.Count, Publishers: cfg.Publishers, Workers: cfg.Workers, Signed: cfg.Sign}
	filler := string(bytes.Repeat([]byte("x"), max(cfg.PayloadBytes, 0)))

	pids := cfg.NodePIDs
	if len(pids) == 0 && cfg.ServerPID > 0 {
		pids = []int{cfg.ServerPID}
	}
	var samples [][]procSample // per phase boundary, per process
	sample := func() (procSample, bool) {
		if len(pids) == 0 {
			return procSample{}, false
		}
		var sum procSample
		each := make([]procSample, len(pids))
		for i, pid := range pids {
			s, err := readProc(pid)
			if err != nil {
				return procSample{}, false
			}
			each[i] = s
			sum.CPU += s.CPU
			sum.HWM += s.HWM
		}
		samples = append(samples, each)
		return sum, true
	}

	// Phase 1: publish.
	var next atomic.Int64
	var pubLat []time.Duration
	var latMu sync.Mutex
	p0, okP0 := sample()
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < cfg.Publishers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for next.Add(1) <= int64(cfg.Count) && ctx.Err() == nil {
				body, _ := json.Marshal(map[string]any{"goal": "bench", "namespace": ns, "payload": map[string]any{"f": filler}})
				t0 := time.Now()
				st, b, err := c.do(ctx, "POST", "/intent", "", body, nil)
				switch {
				case err != nil:
					c.fail("CLIENT_ERROR")
				case st != http.StatusCreated:
					c.fail(errCode(st, b))
				default:
					lat = append(lat, time.Since(t0))
				}
			}
			latMu.Lock()
			pubLat = append(pubLat, lat...)
			latMu.Unlock()
		}()
	}
	wg.Wait()
	pubElapsed := time.Since(start)
	p1, okP1 := sample()
	sum.Published = int64(len(pubLat))
	sum.PublishElapsedS = round3(pubElapsed.Seconds())
	sum.PublishPerSecond = math.Round(float64(sum.Published) / pubElapsed.Seconds())
	slices.Sort(pubLat)
	sum.PublishP50ms, sum.PublishP99ms = ms(percentile(pubLat, 0.5)), ms(percentile(pubLat, 0.99))
	cfg.Logger.Info("published", "jobs", sum.Published, "perSecond", sum.PublishPerSecond)

	// Phase 2: claim and fulfill until the queue is empty.
	claims := map[string]int{}
	var fulfills, dupFulfill atomic.Int64
	fulfilledIDs := sync.Map{}
	var claimLat, fulLat []time.Duration
	start = time.Now()
	for i := 0; i < cfg.Workers; i++ {
		base := cfg.URL
		if len(cfg.WorkerURLs) > 0 {
			base = cfg.WorkerURLs[i%len(cfg.WorkerURLs)]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cl, fl []time.Duration
			defer func() {
				latMu.Lock()
				claimLat = append(claimLat, cl...)
				fulLat = append(fulLat, fl...)
				latMu.Unlock()
			}()
			for ctx.Err() == nil {
				t0 := time.Now()
				st, b, err := c.doAt(ctx, base, "POST", "/claim", "namespace="+ns, nil, nil)
				if err != nil {
					c.fail("CLIENT_ERROR")
					continue
				}
				if st == http.StatusNoContent {
					return
				}
				if st != http.StatusOK {
					c.fail(errCode(st, b))
					continue
				}
				cl = append(cl, time.Since(t0))
				var got struct {
					ID         string `json:"id"`
					ClaimToken string `json:"claim_token"`
				}
				if json.Unmarshal(b, &got) != nil || got.ID == "" {
					c.fail("BAD_CLAIM")
					continue
				}
				latMu.Lock()
				claims[got.ID]++
				latMu.Unlock()
				body, _ := json.Marshal(map[string]any{"claim_token": got.ClaimToken, "result": map[string]any{"ok": true}})
				t1 := time.Now()
				st, b, err = c.doAt(ctx, base, "POST", "/fulfill/"+got.ID, "", body, nil)
				switch {
				case err != nil:
					c.fail("CLIENT_ERROR")
				case st != http.StatusOK:
					c.fail(errCode(st, b))
				default:
					fl = append(fl, time.Since(t1))
					fulfills.Add(1)
					if _, dup := fulfilledIDs.LoadOrStore(got.ID, true); dup {
						dupFulfill.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	drain := time.Since(start)
	p2, okP2 := sample()
	sum.Fulfilled = fulfills.Load()
	sum.DrainElapsedS = round3(drain.Seconds())
	sum.JobsPerSecond = math.Round(float64(sum.Fulfilled) / drain.Seconds())
	slices.Sort(claimLat)
	slices.Sort(fulLat)
	sum.ClaimP50ms, sum.ClaimP99ms = ms(percentile(claimLat, 0.5)), ms(percentile(claimLat, 0.99))
	sum.FulfillP50ms, sum.FulfillP99ms = ms(percentile(fulLat, 0.5)), ms(percentile(fulLat, 0.99))
	for _, n := range claims {
		if n > 1 {
			sum.DuplicateJobs += int64(n - 1)
		}
	}
	sum.DuplicateFulfl = dupFulfill.Load()
	sum.Errors = c.nerr.Load()
	if len(c.errs) > 0 {
		sum.ErrorCodes = c.errs
	}
	if okP0 && okP1 && sum.Published > 0 {
		v := round3(float64((p1.CPU - p0.CPU).Microseconds()) / 1000 / float64(sum.Published))
		sum.ServerCPUmsPerPublish = &v
	}
	if okP1 && okP2 && sum.Fulfilled > 0 {
		v := round3(float64((p2.CPU - p1.CPU).Microseconds()) / 1000 / float64(sum.Fulfilled))
		sum.ServerCPUmsPerJob = &v
		cores := round3((p2.CPU - p1.CPU).Seconds() / drain.Seconds())
		sum.ServerCPUCoresDrain = &cores
		rss := mb(p2.HWM)
		sum.ServerRSSMB = &rss
	}
	if len(cfg.NodePIDs) > 0 && len(samples) == 3 {
		for i, pid := range cfg.NodePIDs {
			nf := jobsNodeFigures{PID: pid}
			if i < len(cfg.NodeURLs) {
				nf.URL = cfg.NodeURLs[i]
			}
			nf.ServerCPUmsPerPublish = perOp(samples[1][i].CPU-samples[0][i].CPU, sum.Published)
			nf.ServerCPUmsPerJob = perOp(samples[2][i].CPU-samples[1][i].CPU, sum.Fulfilled)
			sum.ClusterNodes = append(sum.ClusterNodes, nf)
		}
	}
	sum.Ed25519VerifyMs, sum.ServerCPUVerifies = floorFields(verifyFloor(), sum.ServerCPUmsPerJob)
	if sum.Fulfilled != sum.Published {
		return sum, fmt.Errorf("jobs bench: %d published but %d fulfilled", sum.Published, sum.Fulfilled)
	}
	return sum, nil
}

// perOp is cpu in milliseconds per one of n operations, nil when n is 0.
func perOp(cpu time.Duration, n int64) *float64 {
	if n <= 0 {
		return nil
	}
	v := round3(float64(cpu.Microseconds()) / 1000 / float64(n))
	return &v
}

func errCode(status int, body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return e.Error.Code
	}
	return "HTTP_" + strconv.Itoa(status)
}

// WriteTable prints the summary as aligned lines.
func (s *JobsSummary) WriteTable(w io.Writer) error {
	f := func(p *float64) string {
		if p == nil {
			return "n/a"
		}
		return strconv.FormatFloat(*p, 'f', 3, 64)
	}
	_, err := fmt.Fprintf(w, `mode                      jobs (Intent Protocol v2.1, signed=%v)
jobs                      %d (publishers %d, workers %d)
publish/s                 %.0f  (p50 %.2f ms, p99 %.2f ms)
claim+fulfill jobs/s      %.0f
claim p50 / p99           %.2f / %.2f ms
fulfill p50 / p99         %.2f / %.2f ms
duplicate claims          %d
duplicate fulfills        %d
errors                    %d %v
server CPU ms / publish   %s
server CPU ms / job       %s  (%s cores while draining)
server peak RSS MB        %s
`, s.Signed, s.Count, s.Publishers, s.Workers, s.PublishPerSecond, s.PublishP50ms, s.PublishP99ms,
		s.JobsPerSecond, s.ClaimP50ms, s.ClaimP99ms, s.FulfillP50ms, s.FulfillP99ms, s.DuplicateJobs, s.DuplicateFulfl,
		s.Errors, s.ErrorCodes, f(s.ServerCPUmsPerPublish), f(s.ServerCPUmsPerJob), f(s.ServerCPUCoresDrain), f(s.ServerRSSMB))
	if err != nil {
		return err
	}
	var extra []string
	for i, n := range s.ClusterNodes {
		extra = append(extra, fmt.Sprintf("node %d %s: server CPU ms / publish %s, / job %s", i, n.URL, f(n.ServerCPUmsPerPublish), f(n.ServerCPUmsPerJob)))
	}
	if one := s.SingleNode; one != nil {
		extra = append(extra, fmt.Sprintf("one node: publish/s %.0f, jobs/s %.0f, claim p99 %.2f ms, server CPU ms / job %s",
			one.PublishPerSecond, one.JobsPerSecond, one.ClaimP99ms, f(one.ServerCPUmsPerJob)), s.VsSingleNode.String())
	}
	extra = append(extra, s.Notes...)
	for _, e := range extra {
		if _, err := fmt.Fprintln(w, "  "+e); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints the summary as one JSON object.
func (s *JobsSummary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}
