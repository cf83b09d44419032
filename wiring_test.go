package beam

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/attest"
	"github.com/beamdir/beam/tracing"
)

// These tests pin the assembly in server.go: each route group, hook and
// limit that New wires is asked for once, so that leaving a wiring line out
// fails here rather than passing quietly.

// get sends a GET with an optional bearer token and Accept header and returns
// the status, the content type and the body.
func (l *liveServer) get(path, token, accept string) (int, string, string) {
	l.t.Helper()
	req, err := http.NewRequest(http.MethodGet, l.url+path, nil)
	require.NoError(l.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(l.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(l.t, err)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

// TestServerWiresEveryRouteGroup asks one route of every group the assembly
// mounts, the operator-only endpoints and the dashboard's federation and
// jobs cards, on a directory with federation and the intent bus on.
func TestServerWiresEveryRouteGroup(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{Domain: "wired.beam.directory", Federation: Federation{NATSListen: "127.0.0.1:0"}, JobBus: JobBus{Enabled: true}})
	const admin, viewer = browserAdminToken, browserViewerToken

	t.Run("health", func(t *testing.T) {
		status, ctype, body := l.get("/health", "", "")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, ctype, "application/json")
		require.Contains(t, body, `"status":"ok"`)
	})
	t.Run("metrics are operator-only and carry the Go and process collectors", func(t *testing.T) {
		status, _, _ := l.get("/metrics", "", "")
		require.Equal(t, http.StatusUnauthorized, status)
		status, _, body := l.get("/metrics", admin, "")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "go_goroutines")
		require.Contains(t, body, "process_start_time_seconds")
		for _, prefix := range []string{"beam_log_", "beam_ws_sessions", "beam_bus_", "beam_mesh_", "beam_federation_"} {
			require.Contains(t, body, "\n"+prefix, "the components register their own metrics")
		}
	})
	t.Run("pprof is operator-only", func(t *testing.T) {
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/symbol",
			"/debug/pprof/trace?seconds=0.01", "/debug/pprof/profile?seconds=1"} {
			status, _, _ := l.get(path, "", "")
			require.Equal(t, http.StatusUnauthorized, status, path)
			status, _, _ = l.get(path, admin, "")
			require.Equal(t, http.StatusOK, status, path)
		}
	})
	t.Run("index answers JSON and sends browsers to the dashboard", func(t *testing.T) {
		status, ctype, body := l.get("/", "", "application/json")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, ctype, "application/json")
		require.Contains(t, body, `"links"`)
		status, _, _ = l.get("/", "", "text/html")
		require.Equal(t, http.StatusFound, status)
	})
	// Each group answers in the Beam JSON shape (not the mux's plain-text
	// 404); the operator token opens the operator-only ones.
	for _, path := range []string{
		"/agents/search",            // registry
		"/orgs/wired/members",       // registry, operator
		"/intents/catalog",          // directory
		"/stats",                    // directory
		"/v1/beam/stats",            // bus
		"/v1/beam/dead-letter",      // bus, operator
		"/api/v1/mesh/dead-letters", // pipelines, operator
		"/federation/self",          // federation
		"/federation/outbox",        // federation, operator
		"/observability/overview",   // dashboard
	} {
		t.Run("route "+path, func(t *testing.T) {
			status, ctype, body := l.get(path, admin, "application/json")
			require.Equal(t, http.StatusOK, status, body)
			require.Contains(t, ctype, "application/json", body)
		})
	}
	t.Run("attestation key is the data directory's, named by the domain", func(t *testing.T) {
		status, _, body := l.get(wire.AttestationKeysPath, "", "")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, body, `"wired.beam.directory"`)
		key, err := attest.LoadOrCreate(l.srv.cfg.DataDir, "wired.beam.directory")
		require.NoError(t, err)
		require.Contains(t, body, key.KeyID())
	})
	t.Run("dashboard login page", func(t *testing.T) {
		status, ctype, _ := l.get("/dashboard/login", "", "text/html")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, ctype, "text/html")
	})
	t.Run("dashboard shows federation", func(t *testing.T) {
		status, _, body := l.get("/observability/federation", viewer, "")
		require.Equal(t, http.StatusOK, status, body)
		var card struct {
			Configured bool `json:"configured"`
			Status     any  `json:"status"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &card))
		require.True(t, card.Configured, body)
		require.NotNil(t, card.Status, body)
	})
	t.Run("dashboard shows the intent bus", func(t *testing.T) {
		status, _, body := l.get("/observability/jobs", viewer, "")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, body, `"enabled":true`)
	})
	t.Run("dashboard may requeue bus dead letters", func(t *testing.T) {
		status, _, body := l.get("/observability/dead-letters", admin, "")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, body, `"allowed":true`)
	})
	t.Run("directory shows operators its sessions", func(t *testing.T) {
		status, _, body := l.get("/stats", admin, "")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, body, `"sessions"`)
	})
	t.Run("dashboard may requeue pipeline dead letters", func(t *testing.T) {
		status, _, body := l.get("/observability/mesh", admin, "")
		require.Equal(t, http.StatusOK, status, body)
		require.Contains(t, body, `"requeue":{"allowed":true}`)
	})
	t.Run("intent bus is served on its own listener", func(t *testing.T) {
		require.NotNil(t, l.srv.JobBus())
		secret, _ := l.srv.JobBusSecret()
		require.NotEmpty(t, secret)
		require.NotNil(t, l.srv.Federation())
	})
}

// TestServerWiresRateLimits sets each per-address limit to one request and
// sees the second answered 429 in the Beam shape.
func TestServerWiresRateLimits(t *testing.T) {
	t.Parallel()
	perHour := Rate{N: 1, Per: time.Hour}
	l := startLive(t, Config{Limits: &Limits{Register: perHour, Connect: perHour}})
	for _, c := range []struct{ method, path string }{{http.MethodPost, "/agents/register"}, {http.MethodGet, "/ws"}} {
		var statuses []int
		for range 2 {
			req, err := http.NewRequest(c.method, l.url+c.path, strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
			if resp.StatusCode == http.StatusTooManyRequests {
				require.Contains(t, string(body), `"errorCode":"RATE_LIMITED"`)
			}
		}
		require.NotEqual(t, http.StatusTooManyRequests, statuses[0], c.path)
		require.Equal(t, http.StatusTooManyRequests, statuses[1], c.path)
	}
}

// TestServerWiresConnectionCapAndTimeouts checks the listener cap, the
// idle timeout and the write timeout the assembly puts on the HTTP server.
func TestServerWiresConnectionCapAndTimeouts(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{Limits: &Limits{MaxConnsPerAddr: 1, IdleTimeout: 200 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond}})
	addr := strings.TrimPrefix(l.url, "http://")

	// The first connection asks /health and stays open (keep-alive).
	first, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer first.Close()
	_, err = io.WriteString(first, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(first)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// A second one from the same address is over the cap: closed unanswered.
	second, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer second.Close()
	_, _ = io.WriteString(second, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, second.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = http.ReadResponse(bufio.NewReader(second), nil)
	require.Error(t, err, "a second connection from one address is refused")
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "refused by closing, not left hanging: %v", err)

	// The idle first connection is closed by the server's idle timeout.
	require.NoError(t, first.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the server closes an idle keep-alive connection")

	// No route outlives the write timeout without asking (streams clear it,
	// pprof extends it), so the configured value is read back.
	require.Equal(t, 500*time.Millisecond, l.srv.httpSrv.WriteTimeout)
}

// TestServerWiresHeaderTimeout sends half a request's headers and sees the
// connection closed by the header timeout.
func TestServerWiresHeaderTimeout(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{Limits: &Limits{ReadHeaderTimeout: 200 * time.Millisecond}})
	addr := strings.TrimPrefix(l.url, "http://")
	// Headers sent too slowly: the connection is closed.
	slow, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer slow.Close()
	_, err = io.WriteString(slow, "GET /health HTTP/1.1\r\n")
	require.NoError(t, err)
	require.NoError(t, slow.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = bufio.NewReader(slow).ReadByte()
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the header timeout closes the connection: %v", err)
	require.Error(t, err)

}

// TestServerRecoversOnRestart leaves two directory intents half-way in the
// log and restarts the server on the same data directory: the startup
// recovery fails the one never delivered, and the recovery sweep the
// server starts fails the delivered one once its deadline passes.
func TestServerRecoversOnRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro())
	cfg := Config{DataDir: t.TempDir(), Logger: quietLogger(), Synchronous: "NORMAL", Limits: &Limits{},
		Clock: func() time.Time { return time.UnixMicro(now.Load()) }, Timeouts: Timeouts{RecoverySweep: 10 * time.Millisecond}}
	s, err := New(ctx, cfg)
	require.NoError(t, err)
	ev := func(nonce string, st tracing.State) tracing.Event {
		return tracing.Event{Nonce: nonce, State: st, From: "a@x.beam.directory", To: "b@x.beam.directory", IntentType: "t",
			Details: tracing.Details{TimeoutMs: 60_000}}
	}
	_, err = s.Log().Append(ctx, ev("recover-1", tracing.Received))
	require.NoError(t, err)
	_, err = s.Log().Append(ctx, ev("recover-2", tracing.Received), ev("recover-2", tracing.Dispatched), ev("recover-2", tracing.Delivered))
	require.NoError(t, err)
	require.NoError(t, s.Shutdown(ctx))

	s, err = New(ctx, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Shutdown(ctx)) }()
	row, ok, err := s.Log().Intent(ctx, "recover-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tracing.Failed, row.Status)
	require.Equal(t, "DELIVERY_FAILED", row.ErrorCode)
	row, _, err = s.Log().Intent(ctx, "recover-2")
	require.NoError(t, err)
	require.Equal(t, tracing.Delivered, row.Status, "its deadline has not passed")

	now.Add((2 * time.Minute).Microseconds())
	require.Eventually(t, func() bool {
		row, _, err := s.Log().Intent(ctx, "recover-2")
		require.NoError(t, err)
		return row.Status == tracing.Failed && row.ErrorCode == "TIMEOUT"
	}, 10*time.Second, 10*time.Millisecond)
}

// TestServerServesTheIntentCatalog gives the server a catalog and reads it
// back from GET /intents/catalog.
func TestServerServesTheIntentCatalog(t *testing.T) {
	t.Parallel()
	cat := []byte(`{"intents":[{"id":"wired.check","description":"the wiring test's intent"}]}`)
	l := startLive(t, Config{IntentCatalog: cat})
	status, _, body := l.get("/intents/catalog", "", "")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `"wired.check"`)
}
