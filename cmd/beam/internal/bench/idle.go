package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// fdHeadroom is how many descriptors the load generator and the server
// each keep for everything but the idle sessions (the log's files, the
// senders' and recipients' sessions, HTTP clients, listeners).
const fdHeadroom = 256

// agentsPerSourceAddr is how many idle agents dial from one loopback
// source address: well under the ~28,000 ephemeral ports Linux gives one
// source and destination pair.
const agentsPerSourceAddr = 16_000

// idleFigures break down what the server holds per idle agent, read from
// its /metrics after a forced garbage collection before the idle agents
// registered and once they were all connected.
type idleFigures struct {
	// HeapBytes is live Go heap (go_memstats_heap_inuse_bytes) per agent:
	// its registry entry and its session.
	HeapBytes float64 `json:"heap_bytes"`
	// StackBytes is goroutine stack (go_memstats_stack_inuse_bytes) per
	// agent.
	StackBytes float64 `json:"stack_bytes"`
	// Goroutines is go_goroutines per agent.
	Goroutines float64 `json:"goroutines"`
	// FreeHeapBytes is heap the runtime has free but has not returned to
	// the operating system (heap_idle − heap_released) per agent: garbage of
	// the connects, part of the RSS until the scavenger returns it.
	FreeHeapBytes float64 `json:"free_heap_bytes"`
	// RSSBytesAfterGC is the server's RSS per agent after the collection.
	RSSBytesAfterGC float64 `json:"rss_bytes_after_gc"`
}

// runIdle registers and connects cfg.IdleAgents idle agents (as many as
// the descriptor limits of this process and the server allow), samples the
// server's RSS before and after, and fills in the summary's idle figures:
// the RSS with them, the bytes per agent, and, when fewer than asked could
// connect, the RSS extrapolated to the number asked for.
func runIdle(ctx context.Context, f *fleet, cfg Config, sum *Summary) error {
	lg := cfg.Logger
	n := cfg.IdleAgents
	if capacity, limit, err := idleCapacity(cfg.ServerPID); err != nil {
		sum.Notes = append(sum.Notes, "descriptor limits not read: "+err.Error())
	} else if capacity < n {
		n = max(capacity, 0)
		sum.Notes = append(sum.Notes, fmt.Sprintf(
			"%d idle agents asked for, %d connected: %s (each idle agent is one socket on each side; a hard limit cannot be raised from here, and more load-generator processes would not help the server's side)",
			cfg.IdleAgents, n, limit))
	}
	sum.IdleConnected = n
	if n == 0 {
		return nil
	}
	var before, beforeGC procSample
	var beforeM map[string]float64
	if cfg.ServerPID > 0 {
		beforeM, beforeGC = serverMemory(ctx, cfg, sum)
		if s, err := readProc(cfg.ServerPID); err == nil {
			before = s
			v := mb(s.RSS)
			sum.ServerRSSBeforeIdleMB = &v
		}
	}
	lg.Info("registering idle agents", "n", n, "parallel", cfg.RegisterParallel)
	t0 := time.Now()
	addrs, err := connectIdle(ctx, f, cfg, n)
	if err != nil {
		return err
	}
	sum.IdleSourceAddrs = addrs
	sum.IdleConnectS = round3(time.Since(t0).Seconds())
	lg.Info("idle agents connected", "n", f.IdleConnected(), "seconds", sum.IdleConnectS, "source_addrs", addrs)
	if cfg.ServerPID <= 0 {
		return nil
	}
	after, err := settledRSS(ctx, cfg.ServerPID)
	if err != nil {
		sum.Notes = append(sum.Notes, "idle RSS: "+err.Error())
		return nil
	}
	sum.ServerRSSIdleMB, sum.ServerRSSKBPerIdleAgent, sum.ServerRSSIdleExtrapolatedMB = idleRSS(before, after, n, cfg.IdleAgents)
	if afterM, afterGC := serverMemory(ctx, cfg, sum); beforeM != nil && afterM != nil {
		per := func(k string) float64 { return math.Round((afterM[k]-beforeM[k])/float64(n)*100) / 100 }
		fig := &idleFigures{
			HeapBytes: per("go_memstats_heap_inuse_bytes"), StackBytes: per("go_memstats_stack_inuse_bytes"),
			Goroutines: per("go_goroutines"),
		}
		free := func(m map[string]float64) float64 {
			return m["go_memstats_heap_idle_bytes"] - m["go_memstats_heap_released_bytes"]
		}
		fig.FreeHeapBytes = math.Round((free(afterM) - free(beforeM)) / float64(n))
		if beforeGC.RSS > 0 && afterGC.RSS > 0 {
			fig.RSSBytesAfterGC = math.Round(float64(afterGC.RSS-beforeGC.RSS) / float64(n))
		}
		sum.ServerPerIdleAgent = fig
	}
	if cfg.IdleSettle > 0 {
		lg.Info("leaving the idle agents idle", "for", cfg.IdleSettle)
		t := time.NewTimer(cfg.IdleSettle)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		settled, err := readProc(cfg.ServerPID)
		if err != nil {
			sum.Notes = append(sum.Notes, "settled idle RSS: "+err.Error())
			return nil
		}
		sum.IdleSettleS = cfg.IdleSettle.Seconds()
		sum.ServerRSSIdleSettledMB, sum.ServerRSSKBPerIdleAgentSettled, sum.ServerRSSIdleSettledExtrapolatedMB = idleRSS(before, settled, n, cfg.IdleAgents)
	}
	return nil
}

// idleRSS turns the server's RSS before the n idle agents registered and
// with them connected into the summary's figures: the RSS with them, the
// KB per agent and, when fewer than asked (want) connected, the RSS
// extrapolated to want.
func idleRSS(before, with procSample, n, want int) (rssMB, kbPerAgent, extrapolatedMB *float64) {
	v := mb(with.RSS)
	rssMB = &v
	if before.RSS <= 0 {
		return rssMB, nil, nil
	}
	per := float64(with.RSS-before.RSS) / float64(n)
	kb := math.Round(per/1024*100) / 100
	kbPerAgent = &kb
	if n < want {
		x := mb(before.RSS + int64(per*float64(want)))
		extrapolatedMB = &x
	}
	return rssMB, kbPerAgent, extrapolatedMB
}

// idleCapacity returns how many idle agents the descriptor limits of this
// process and of the server (when its pid is known) leave room for, and
// which limit bounds it.
func idleCapacity(serverPID int) (int, string, error) {
	soft, open, err := fdUse("self")
	if err != nil {
		return 0, "", err
	}
	capacity := soft - open - fdHeadroom
	limit := fmt.Sprintf("the load generator's open-file limit is %d", soft)
	if serverPID > 0 {
		ssoft, sopen, err := fdUse(strconv.Itoa(serverPID))
		if err != nil {
			return 0, "", err
		}
		if c := ssoft - sopen - fdHeadroom; c < capacity {
			capacity = c
			limit = fmt.Sprintf("the server's open-file limit is %d", ssoft)
		}
	}
	return capacity, limit, nil
}

// fdUse reads a process's soft open-file limit and how many descriptors it
// has open, from /proc.
func fdUse(pid string) (soft, open int, err error) {
	if runtime.GOOS != "linux" {
		return 0, 0, errors.New("open-file limits are read from /proc (Linux only)")
	}
	raw, err := readBounded("/proc/" + pid + "/limits")
	if err != nil {
		return 0, 0, fmt.Errorf("read limits of %s: %w", pid, err)
	}
	if soft, err = parseOpenFilesLimit(raw); err != nil {
		return 0, 0, fmt.Errorf("limits of %s: %w", pid, err)
	}
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		return 0, 0, fmt.Errorf("count descriptors of %s: %w", pid, err)
	}
	return soft, len(fds), nil
}

// parseOpenFilesLimit returns the soft "Max open files" of a
// /proc/<pid>/limits file; unlimited is math.MaxInt32.
func parseOpenFilesLimit(limits []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(limits))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Max open files")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 {
			break
		}
		if fields[0] == "unlimited" {
			return math.MaxInt32, nil
		}
		v, err := strconv.Atoi(fields[0])
		if err != nil || v < 0 {
			return 0, fmt.Errorf("max open files %q", fields[0])
		}
		return v, nil
	}
	return 0, errors.New("no max open files line")
}

// serverMemory forces a garbage collection in the server (its operator
// heap profile endpoint) and reads its Go memory figures from /metrics,
// then its RSS. Without an operator token it returns nil and notes why.
func serverMemory(ctx context.Context, cfg Config, sum *Summary) (map[string]float64, procSample) {
	if cfg.OperatorToken == "" {
		if !strings.Contains(strings.Join(sum.Notes, "\n"), "operator token") {
			sum.Notes = append(sum.Notes, "no per-agent heap and stack figures: they are read from the server's /metrics, which needs its operator token (beam bench passes it to the server it starts)")
		}
		return nil, procSample{}
	}
	get := func(path string) ([]byte, error) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, cfg.URL+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+cfg.OperatorToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return body, nil
	}
	if _, err := get("/debug/pprof/heap?gc=1"); err != nil {
		sum.Notes = append(sum.Notes, "server heap figures: "+err.Error())
		return nil, procSample{}
	}
	raw, err := get("/metrics")
	if err != nil {
		sum.Notes = append(sum.Notes, "server heap figures: "+err.Error())
		return nil, procSample{}
	}
	s, _ := readProc(cfg.ServerPID)
	return parseMetrics(raw), s
}

// parseMetrics reads the unlabelled samples of a Prometheus text
// exposition (name value per line).
func parseMetrics(raw []byte) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// idleClient returns the HTTP client idle agents dial with and how many
// source addresses it uses: on a loopback directory, connections are
// spread over 127.0.0.2, 127.0.0.3, … (one per agentsPerSourceAddr agents,
// at least two), because one source address has only ~28,000 ephemeral
// ports towards one server address.
func idleClient(base string, n int) (*http.Client, int) {
	u, err := url.Parse(base)
	if err != nil || runtime.GOOS != "linux" {
		return newHTTPClient(64), 1
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return newHTTPClient(64), 1
	}
	k := max(2, (n+agentsPerSourceAddr-1)/agentsPerSourceAddr)
	srcs := make([]*net.TCPAddr, k)
	for i := range srcs {
		srcs[i] = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}
	}
	var next atomic.Uint64
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			src := srcs[next.Add(1)%uint64(len(srcs))]
			d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: src}
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
	}
	return &http.Client{Transport: tr}, k
}

// connectIdle registers and connects n idle agents that only keep their
// sessions open (answering pings); it returns how many source addresses
// they connect from.
func connectIdle(ctx context.Context, f *fleet, cfg Config, n int) (int, error) {
	idle, err := registerMany(ctx, f.hc, []string{cfg.URL}, cfg.Org, "idle", n, cfg.RegisterParallel)
	if err != nil {
		return 0, err
	}
	hc, addrs := idleClient(cfg.URL, n)
	defer hc.CloseIdleConnections()
	next := make(chan *agent)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range max(1, min(cfg.RegisterParallel*4, len(idle))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range next {
				conn, err := dial(ctx, hc, cfg.URL, a)
				if err != nil {
					select {
					case errc <- err:
					default:
					}
					continue
				}
				// CloseRead keeps reading (and answering pings) in the
				// background; the session only ever carries control frames
				// now that "connected" was read.
				conn.CloseRead(f.ctx)
				f.mu.Lock()
				f.conns = append(f.conns, conn)
				f.idle++
				f.mu.Unlock()
			}
		}()
	}
	var firstErr error
feed:
	for _, a := range idle {
		select {
		case next <- a:
		case err := <-errc:
			firstErr = err
			break feed
		case <-ctx.Done():
			firstErr = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr == nil {
		select {
		case firstErr = <-errc:
		default:
		}
	}
	if firstErr != nil {
		return addrs, fmt.Errorf("connect idle agents: %w", firstErr)
	}
	return addrs, nil
}

// settledRSS samples the server until its RSS stops growing (the last
// sessions' buffers and goroutines settle) or two seconds pass.
func settledRSS(ctx context.Context, pid int) (procSample, error) {
	prev, err := readProc(pid)
	if err != nil {
		return prev, err
	}
	deadline := time.Now().Add(2 * time.Second)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return prev, ctx.Err()
		case <-t.C:
		}
		s, err := readProc(pid)
		if err != nil {
			return prev, err
		}
		if s.RSS <= prev.RSS {
			return s, nil
		}
		prev = s
	}
	return prev, nil
}
