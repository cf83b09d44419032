package tracing

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

var flagBenchEvents = flag.Int("tracing.bench.events", 50000,
	"events in the prebuilt log of BenchmarkRebuild and BenchmarkOpen (use 1000000 for the real number)")

var quiet = slog.New(slog.DiscardHandler)

var benchLog struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if benchLog.dir != "" {
		_ = os.RemoveAll(benchLog.dir)
	}
	os.Exit(code)
}

// lifecycle is the i-th event of a typical directory intent: received (with
// its frame), validated, dispatched, delivered, acked (with its result).
func lifecycle(nonce string, step int) Event {
	switch step % 5 {
	case 0:
		return Event{Nonce: nonce, State: Received, From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
			IntentType: "task.run", Transport: "ws", Details: Details{Owner: OwnerDirectory,
				ClientTimestamp: "2026-01-02T03:04:05.000Z",
				Frame: json.RawMessage(`{"v":"1","intent":"task.run","from":"alice@acme.beam.directory","to":"bob@acme.beam.directory","payload":{"task":"summarize","doc":42},"nonce":"` +
					nonce + `","timestamp":"2026-01-02T03:04:05.000Z","signature":"MEUCIQDx3Yk0c1Y9l1Q8n3Jt2m9yJ4H1c7m9Q=="}`)}}
	case 1:
		return Event{Nonce: nonce, State: Validated}
	case 2:
		return Event{Nonce: nonce, State: Dispatched, Transport: "ws", Attempt: 1, Details: Details{TimeoutMs: 30000}}
	case 3:
		return Event{Nonce: nonce, State: Delivered}
	default:
		lat := int64(12)
		return Event{Nonce: nonce, State: Acked, Details: Details{LatencyMs: &lat,
			Result: json.RawMessage(`{"v":"1","success":true,"nonce":"` + nonce + `","payload":{"summary":"ok"}}`)}}
	}
}

// prebuiltLog returns the path of a log with *flagBenchEvents events (5% of
// the intents left non-terminal), built once per process.
func prebuiltLog(b *testing.B) string {
	b.Helper()
	benchLog.once.Do(func() {
		dir, err := os.MkdirTemp("", "beam-tracing-bench-")
		if err != nil {
			benchLog.err = err
			return
		}
		benchLog.dir = dir
		benchLog.path = filepath.Join(dir, "beam.db")
		start := time.Now()
		l, err := Open(context.Background(), Config{Path: benchLog.path, Synchronous: "OFF"})
		if err != nil {
			benchLog.err = err
			return
		}
		n := *flagBenchEvents
		batch := make([]Event, 0, 2000)
		intent := 0
		for i := 0; i < n; {
			batch = batch[:0]
			for len(batch) < 2000 && i < n {
				nonce := fmt.Sprintf("bench-%08d", intent)
				intent++
				steps := 5
				if intent%20 == 0 {
					steps = 3 // non-terminal: dispatched
				}
				for s := 0; s < steps && i < n; s++ {
					batch = append(batch, lifecycle(nonce, s))
					i++
				}
			}
			if _, err := l.Append(context.Background(), batch...); err != nil {
				benchLog.err = err
				return
			}
		}
		benchLog.err = l.Close()
		fmt.Fprintf(os.Stderr, "built a log of %d events in %v\n", n, time.Since(start).Round(time.Millisecond))
	})
	require.NoError(b, benchLog.err)
	return benchLog.path
}

func openBench(b *testing.B, path string) *Log { return openShipping(b, path, nil) }

// openShipping opens a log whose batches go to rep (nil: a single node).
func openShipping(b *testing.B, path string, rep Replicator) *Log {
	b.Helper()
	l, err := Open(context.Background(), Config{Path: path, Logger: quiet, Replicator: rep})
	require.NoError(b, err)
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// BenchmarkAppendSingle: one caller, one event per call (every call waits
// for its own fsync).
func BenchmarkAppendSingle(b *testing.B) { benchSingle(b, nil) }

// BenchmarkAppendSingleShipped is BenchmarkAppendSingle in cluster mode
// with a replicator that accepts every batch at once: the cost of
// shipping without its round trip.
func BenchmarkAppendSingleShipped(b *testing.B) { benchSingle(b, acceptAll{}) }

// acceptAll is a Replicator that accepts every batch at once.
type acceptAll struct{}

func (acceptAll) Replicate(context.Context, []byte, int64) error { return nil }

func benchSingle(b *testing.B, rep Replicator) {
	l := openShipping(b, filepath.Join(b.TempDir(), "beam.db"), rep)
	ctx := context.Background()
	b.ResetTimer()
	start, cpu := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		if _, err := l.Append(ctx, lifecycle(fmt.Sprintf("s-%d", i/5), i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/event")
	reportCommits(b, l)
}

// BenchmarkAppendConcurrent64: 64 goroutines, each walking intents through
// received → validated → dispatched → delivered → acked, one event per call.
func BenchmarkAppendConcurrent64(b *testing.B) { benchConcurrent(b, nil, false) }

// BenchmarkAppendConcurrent64Shipped is BenchmarkAppendConcurrent64 in
// cluster mode with a replicator that accepts every batch at once.
func BenchmarkAppendConcurrent64Shipped(b *testing.B) { benchConcurrent(b, acceptAll{}, false) }

// BenchmarkAppendConcurrent64RoundTrip ships to a replicator that takes 2 ms
// per call (a replication round trip): directory intents are released at
// commit, bus messages (durable) after their call.
func BenchmarkAppendConcurrent64RoundTrip(b *testing.B) {
	b.Run("directory", func(b *testing.B) { benchConcurrent(b, slowReplicator{}, false) })
	b.Run("bus", func(b *testing.B) { benchConcurrent(b, slowReplicator{}, true) })
}

// slowReplicator accepts every batch after 2 ms.
type slowReplicator struct{}

func (slowReplicator) Replicate(context.Context, []byte, int64) error {
	time.Sleep(2 * time.Millisecond)
	return nil
}

func benchConcurrent(b *testing.B, rep Replicator, durable bool) {
	l := openShipping(b, filepath.Join(b.TempDir(), "beam.db"), rep)
	ctx := context.Background()
	var next atomic.Int64
	var worker atomic.Int64
	b.SetParallelism((64 + 1) / 2)
	b.ResetTimer()
	start, cpu := time.Now(), cpuTime()
	var total atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		step := 0
		nonce := ""
		for pb.Next() {
			if step%5 == 0 {
				nonce = fmt.Sprintf("c%d-%d", w, next.Add(1))
			}
			ev := lifecycle(nonce, step)
			if durable && step%5 == 0 {
				ev.Details.Owner, ev.Details.Bus = OwnerBus, &BusMessage{MessageID: nonce}
			}
			if _, err := l.Append(ctx, ev); err != nil {
				b.Error(err)
				return
			}
			step++
			total.Add(1)
		}
	})
	elapsed := time.Since(start)
	b.ReportMetric(float64(total.Load())/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(total.Load()), "cpu-µs/event")
	b.ReportMetric(float64(worker.Load()), "goroutines")
	reportCommits(b, l)
}

// cpuTime is the CPU time the process has used (user and system). The
// machine is shared, so CPU per event is steadier than events per second.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCommits reports the mean events per commit and the mean commit time.
func reportCommits(b *testing.B, l *Log) {
	reg := prometheus.NewRegistry()
	if reg.Register(l.m.batch) != nil || reg.Register(l.m.commit) != nil {
		return
	}
	mfs, err := reg.Gather()
	if err != nil {
		return
	}
	for _, mf := range mfs {
		h := mf.GetMetric()[0].GetHistogram()
		n := h.GetSampleCount()
		if n == 0 {
			continue
		}
		switch mf.GetName() {
		case "beam_log_batch_events":
			b.ReportMetric(h.GetSampleSum()/float64(n), "events/commit")
		case "beam_log_commit_seconds":
			b.ReportMetric(h.GetSampleSum()/float64(n)*1e6, "µs/commit")
		}
	}
}

// BenchmarkRebuild refolds the prebuilt log (-tracing.bench.events).
func BenchmarkRebuild(b *testing.B) {
	path := prebuiltLog(b)
	l := openBench(b, path)
	ctx := context.Background()
	b.ResetTimer()
	var events int64
	start, cpu := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		st, err := l.Rebuild(ctx)
		if err != nil {
			b.Fatal(err)
		}
		events += st.Events
	}
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
	b.ReportMetric((cpuTime()-cpu).Seconds()/float64(b.N), "cpu-s/op")
}

// BenchmarkOpen opens (and closes) the prebuilt log.
func BenchmarkOpen(b *testing.B) {
	path := prebuiltLog(b)
	ctx := context.Background()
	b.ResetTimer()
	var cached int
	for i := 0; i < b.N; i++ {
		l, err := Open(ctx, Config{Path: path, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		cached = len(l.w.cache)
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(*flagBenchEvents), "events")
	b.ReportMetric(float64(cached), "cached-intents")
}
