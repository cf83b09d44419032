package demo

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/tracing"
)

func TestDemoProducesEveryOutcome(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dataDir := t.TempDir()
	srv, err := beam.New(ctx, beam.Config{DataDir: dataDir, Synchronous: "NORMAL", Limits: &beam.Limits{}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
	})

	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{DirectoryURL: "http://" + ln.Addr().String(), StateDir: t.TempDir(), Interval: 20 * time.Millisecond})
	}()

	// Successes, failures, asynchronous acceptances and messages queued for
	// the offline agent all show up.
	require.Eventually(t, func() bool {
		counts, err := srv.Log().CountByState(ctx)
		require.NoError(t, err)
		return counts[tracing.Acked] >= 3 && counts[tracing.Failed] >= 1 && counts[tracing.Delivered] >= 1 && counts[tracing.Queued] >= 1
	}, 60*time.Second, 50*time.Millisecond)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not stop with its context")
	}
}
