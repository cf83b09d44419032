package tracing

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkAppendBatch64: one caller appending 64 events (64 intents, one
// step each) per call, so that every commit carries the same work as a
// full commit of BenchmarkAppendConcurrent64 without its scheduling noise:
// cpu-µs/event is close to the writer's cost per event.
func BenchmarkAppendBatch64(b *testing.B) {
	l := openBench(b, filepath.Join(b.TempDir(), "beam.db"))
	ctx := context.Background()
	const width = 64
	batch := make([]Event, width)
	b.ResetTimer()
	start, cpu := time.Now(), cpuTime()
	events := 0
	for i := 0; i < b.N; i++ {
		for j := range batch {
			batch[j] = lifecycle(fmt.Sprintf("b%d-%d", j, i/5), i)
		}
		if _, err := l.Append(ctx, batch...); err != nil {
			b.Fatal(err)
		}
		events += width
	}
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(events), "cpu-µs/event")
	reportCommits(b, l)
}
