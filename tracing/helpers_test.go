package tracing

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

type testBundle struct {
	t    *testing.T
	path string
	log  *Log
	reg  *prometheus.Registry
	now  atomic.Int64 // unix µs of the fake clock
}

// clock advances by one millisecond per call, so event times differ.
func (b *testBundle) clock() time.Time {
	return time.UnixMicro(b.now.Add(1000)).UTC()
}

func setup(t *testing.T, opts ...func(*Config)) *testBundle {
	t.Helper()
	b := &testBundle{t: t, path: filepath.Join(t.TempDir(), "beam.db")}
	b.now.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro())
	b.open(opts...)
	t.Cleanup(func() { _ = b.log.Close() })
	return b
}

func (b *testBundle) open(opts ...func(*Config)) {
	b.t.Helper()
	b.reg = prometheus.NewRegistry()
	cfg := Config{Path: b.path, Clock: b.clock, Registerer: b.reg}
	for _, o := range opts {
		o(&cfg)
	}
	l, err := Open(context.Background(), cfg)
	require.NoError(b.t, err)
	b.log = l
}

func (b *testBundle) reopen(opts ...func(*Config)) {
	b.t.Helper()
	require.NoError(b.t, b.log.Close())
	b.open(opts...)
}

func received(nonce string) Event {
	return Event{Nonce: nonce, State: Received, From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
		IntentType: "task.run", Transport: "ws"}
}

func ev(nonce string, s State) Event { return Event{Nonce: nonce, State: s} }

func (b *testBundle) append(evs ...Event) []Event {
	b.t.Helper()
	out, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
	return out
}

// state returns nonce's state in the log ("" when it has none).
func (b *testBundle) state(nonce string) State {
	b.t.Helper()
	st, _, err := b.log.State(context.Background(), nonce)
	require.NoError(b.t, err)
	return st
}

// blockWriter makes the writer run a Do function that waits until the
// returned release function is called, so that requests submitted in the
// meantime queue up and share the next batch.
func (b *testBundle) blockWriter() (release func()) {
	b.t.Helper()
	entered := make(chan struct{})
	gate := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := b.log.Do(context.Background(), func(*sqlx.Tx) error {
			close(entered)
			<-gate
			return nil
		})
		done <- err
	}()
	<-entered
	return func() {
		close(gate)
		require.NoError(b.t, <-done)
	}
}

// waitQueued waits until n requests are queued behind a blocked writer.
func (b *testBundle) waitQueued(n int) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		b.log.qmu.Lock()
		defer b.log.qmu.Unlock()
		return len(b.log.queue) >= n
	}, 10*time.Second, time.Millisecond)
}

// metric returns the value of a counter or gauge (or a histogram's sample
// count) named name whose labels include the given name=value pairs.
func (b *testBundle) metric(name string, labels ...string) float64 {
	b.t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(b.t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
