package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

func TestMain(m *testing.M) {
	os.Exit(beamtest.Main(m))
}

type testBundle struct {
	url string
	srv *beam.Server
}

// setup runs a directory in this process on a loopback port.
func setup(t *testing.T) *testBundle {
	t.Helper()
	return setupOrgs(t, true) // the bench fleet is one org, as with beam bench's own server
}

// setupOrgs is setup with OpenOrgs set to open.
func setupOrgs(t *testing.T, open bool) *testBundle {
	t.Helper()
	srv, err := beam.New(context.Background(), beam.Config{
		DataDir:     t.TempDir(),
		Limits:      &beam.Limits{},
		Synchronous: "NORMAL",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		OpenOrgs:    open,
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-done)
	})
	return &testBundle{url: "http://" + ln.Addr().String(), srv: srv}
}

func TestBurnDown(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeWS, ModeHTTP} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			sum, err := Run(context.Background(), Config{
				URL: tb.url, Mode: mode, Count: 200, Concurrency: 8, Warmup: 10,
				Senders: 3, Recipients: 2, ServerPID: os.Getpid(),
			})
			require.NoError(t, err)
			require.Zero(t, sum.Errors, "error codes: %v", sum.ErrorCodes)
			require.EqualValues(t, 200, sum.OK)
			require.Zero(t, sum.RecipientErrors)
			require.Equal(t, mode, sum.Mode)
			require.Positive(t, sum.IntentsPerSecond)
			require.LessOrEqual(t, sum.P50ms, sum.P90ms)
			require.LessOrEqual(t, sum.P90ms, sum.P99ms)
			require.LessOrEqual(t, sum.P99ms, sum.Maxms)
			require.NotNil(t, sum.ServerCPUmsPerIntent)
			require.NotNil(t, sum.ServerRSSMB)

			// Every intent of the run, warmup included, is acked in the log.
			counts, err := tb.srv.Log().CountByState(context.Background())
			require.NoError(t, err)
			require.EqualValues(t, 210, counts[tracing.Acked])

			var out bytes.Buffer
			require.NoError(t, sum.WriteJSON(&out))
			var m map[string]any
			require.NoError(t, json.Unmarshal(out.Bytes(), &m))
			for _, k := range []string{"intents_per_second", "p50_ms", "p90_ms", "p99_ms", "errors", "server_cpu_ms_per_intent", "server_rss_mb", "ed25519_verify_ms"} {
				require.Contains(t, m, k)
			}
			// The floor is measured in the run, and the server's cost per
			// intent is stated as a multiple of it.
			require.Greater(t, m["ed25519_verify_ms"], 0.0)
			require.InDelta(t, *sum.ServerCPUmsPerIntent / *sum.Ed25519VerifyMs, m["server_cpu_verifies_per_intent"], 0.01**sum.ServerCPUmsPerIntent / *sum.Ed25519VerifyMs + 0.01)
			out.Reset()
			require.NoError(t, sum.WriteTable(&out))
			require.Contains(t, out.String(), "intents/s")
			require.Contains(t, out.String(), string(mode))
		})
	}
}

// TestMeshAgainstADirectoryWithoutOpenOrgsSaysWhatToDo: pointed at a
// `beam serve` without --open-orgs, the mesh mode's agents are pending
// members and every hop would fail; the run stops before sending and says
// why, instead of reporting every envelope FAILED.
func TestMeshAgainstADirectoryWithoutOpenOrgsSaysWhatToDo(t *testing.T) {
	t.Parallel()
	tb := setupOrgs(t, false)
	_, err := Run(context.Background(), Config{URL: tb.url, Mode: modeMesh, Count: 4, Concurrency: 2, Senders: 2, Recipients: 3})
	require.ErrorContains(t, err, "--open-orgs")

	tb = setup(t)
	sum, err := Run(context.Background(), Config{URL: tb.url, Mode: modeMesh, Count: 4, Concurrency: 2, Senders: 2, Recipients: 3})
	require.NoError(t, err)
	require.Zero(t, sum.Errors, "error codes: %v", sum.ErrorCodes)
	require.EqualValues(t, 4, sum.OK)
}

func TestSteadyRateAndIdleAgents(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	sum, err := Run(context.Background(), Config{
		URL: tb.url, Mode: ModeWS, Rate: 200, Duration: 250 * time.Millisecond, Concurrency: 4,
		IdleAgents: 12, RegisterParallel: 4,
	})
	require.NoError(t, err)
	require.Equal(t, 50, sum.Count)
	require.EqualValues(t, 50, sum.OK)
	require.Zero(t, sum.Errors)
	require.Equal(t, 12, sum.IdleAgents)
	require.Equal(t, 12, sum.IdleConnected)
	require.GreaterOrEqual(t, sum.IdleSourceAddrs, 2, "loopback idle agents dial from several source addresses")
	require.Nil(t, sum.ServerCPUmsPerIntent, "no server pid: no server figures")
	require.Nil(t, sum.ServerRSSMB)
	require.NotEmpty(t, sum.Notes)

	var out bytes.Buffer
	require.NoError(t, sum.WriteJSON(&out))
	var m map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	require.Contains(t, m, "server_rss_mb")
	require.Nil(t, m["server_rss_mb"], "unknown server fields are null")
}

func TestDirectoryErrorCodeKept(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	cfg, err := Config{URL: tb.url, Mode: ModeHTTP, Count: 1, Concurrency: 1, Org: "beta"}.withDefaults()
	require.NoError(t, err)
	hc := newHTTPClient(2)
	a, err := register(context.Background(), hc, cfg.URL, "solo@beta.beam.directory", "beta")
	require.NoError(t, err)
	// An intent to an agent that was never registered fails in the
	// directory; the driver reports the directory's code, not its own.
	ghost := &agent{BeamID: "ghost@beta.beam.directory", Public: a.Public}
	d, err := newHTTPDriver(context.Background(), &env{URL: cfg.URL, HTTP: hc, Config: cfg, Clock: time.Now})
	require.NoError(t, err)
	err = d.Send(context.Background(), a, ghost)
	require.Error(t, err)
	require.NotEqual(t, "CLIENT_ERROR", codeOf(err), "%v", err)
	t.Logf("directory answered %v", err)
}

func TestModes(t *testing.T) {
	t.Parallel()
	// Every mode is available; without a directory the run cannot start.
	_, err := Run(context.Background(), Config{URL: "http://127.0.0.1:1", Mode: modeBus, Count: 1})
	require.ErrorContains(t, err, "connection refused")
	require.False(t, errors.Is(err, ErrModeUnavailable))
	_, err = Run(context.Background(), Config{URL: "http://127.0.0.1:1", Mode: ModeFederation, Count: 1})
	require.ErrorContains(t, err, "peer-url")
	_, err = Run(context.Background(), Config{URL: "http://127.0.0.1:1", Mode: "carrier-pigeon", Count: 1})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrModeUnavailable))
	require.NoError(t, CheckMode(ModeWS))
	require.NoError(t, CheckMode(ModeHTTP))
	require.NoError(t, CheckMode(modeBus))
	require.NoError(t, CheckMode(ModeFederation))
	require.Error(t, CheckMode("smoke-signals"))
	require.Equal(t, "TIMEOUT", codeOf(context.DeadlineExceeded))
	require.Equal(t, "X", codeOf(failure("X", "y")))
	require.Equal(t, "CLIENT_ERROR", codeOf(errors.New("boom")))
}

func TestConfigBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{
		{},
		{URL: "http://x", Count: -1},
		{URL: "http://x", Concurrency: maxConcurrency + 1},
		{URL: "http://x", Rate: 10},
		{URL: "http://x", Rate: -1, Duration: time.Second},
		{URL: "http://x", Rate: 1e9, Duration: time.Hour},
		{URL: "http://x", IdleAgents: maxIdleAgents + 1},
		{URL: "http://x", IdleAgents: 1, IdleSettle: -time.Second},
		{URL: "http://x", PayloadBytes: maxPayloadBytes + 1},
		{URL: "http://x", Senders: maxAgents + 1},
	} {
		_, err := c.withDefaults()
		require.Error(t, err, "%+v", c)
	}
	c, err := Config{URL: "http://x/", Concurrency: 64}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, "http://x", c.URL)
	require.Equal(t, 8, c.Senders)
	require.Equal(t, 8, c.Recipients)
	require.Equal(t, ModeWS, c.Mode)
	require.NotEmpty(t, c.Org)
	require.True(t, json.Valid(c.payload()))
}

func TestMeasureRestart(t *testing.T) {
	t.Parallel()
	bin := beamtest.Binary(t)
	dir := t.TempDir()
	sum, err := MeasureRestart(context.Background(), ServerOptions{Binary: bin, DataDir: dir, Synchronous: "FULL"},
		SeedOptions{Events: 5003, InFlightEvery: 50})
	require.NoError(t, err)
	require.Equal(t, 5003, sum.Events)
	// 1009 intents: every 50th has 3 events, the others 5; the 1009th is
	// cut short by the event count.
	require.Equal(t, 1009, sum.Intents)
	require.Equal(t, 21, sum.InFlight)
	require.Positive(t, sum.FirstStartS)
	require.Positive(t, sum.RestartS)

	// The seeded log is the server's: a restart keeps every event.
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: dir + "/beam.db"})
	require.NoError(t, err)
	defer lg.Close()
	require.GreaterOrEqual(t, lg.LastSeq(), int64(5003))
	counts, err := lg.CountByState(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, sum.Intents-sum.InFlight, counts[tracing.Acked])
}

func TestSeedLogBounds(t *testing.T) {
	t.Parallel()
	_, err := seedLog(context.Background(), t.TempDir(), SeedOptions{})
	require.Error(t, err)
	_, err = seedLog(context.Background(), t.TempDir(), SeedOptions{Events: 10, InFlightEvery: -1})
	require.Error(t, err)
}

func TestStartServerReportsEarlyExit(t *testing.T) {
	t.Parallel()
	bin := beamtest.Binary(t)
	_, err := StartServer(context.Background(), ServerOptions{Binary: bin, DataDir: t.TempDir(), Synchronous: "SOMETIMES"})
	require.Error(t, err)
	require.Contains(t, err.Error(), "exited before serving")
}

func TestTailBuffer(t *testing.T) {
	t.Parallel()
	var tb tailBuffer
	for range 1000 {
		_, _ = tb.Write([]byte("0123456789"))
	}
	require.Len(t, tb.String(), tailBytes)
}
