package beam_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/beamtest"
)

// running is a beam.Server serving on a loopback port.
type running struct {
	srv *beam.Server
	url string
}

func serve(t *testing.T, cfg beam.Config) *running {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = beamtest.Logger(t)
	}
	srv, err := beam.New(context.Background(), cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-served)
	})
	return &running{srv: srv, url: "http://" + ln.Addr().String()}
}

// getJSON GETs path with an optional bearer token, requires want and
// decodes the body into out (when not nil).
func (r *running) getJSON(t *testing.T, path, token string, want int, out any) {
	t.Helper()
	status, body := r.call(t, http.MethodGet, path, token, nil)
	require.Equal(t, want, status, "%s: %s", path, body)
	if out != nil {
		require.NoError(t, json.Unmarshal(body, out), string(body))
	}
}

// call sends method path with an optional bearer token and JSON body and
// returns the status and the body.
func (r *running) call(t *testing.T, method, path, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, r.url+path, bytes.NewReader(body))
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// registerFlood posts n registrations with an empty body from one address
// and reports whether any was answered 429.
func (r *running) registerFlood(t *testing.T, n int) bool {
	t.Helper()
	for range n {
		resp, err := http.Post(r.url+"/agents/register", "application/json", strings.NewReader("{}"))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			return true
		}
	}
	return false
}

// wsAttach registers beamID and opens /ws?beamId=… with no proof of
// identity; it returns the connection.
func (r *running) wsAttach(t *testing.T, beamID string) *websocket.Conn {
	t.Helper()
	ctx := context.Background()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: r.url, Identity: id})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Register(ctx, "legacy", []string{"conversation.message"})
	require.NoError(t, err)
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(r.url, "http")+"/ws?beamId="+beamID, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseNow() })
	return conn
}

type self struct {
	Domain  string `json:"domain"`
	Line    string `json:"line"`
	NATSURL string `json:"natsUrl"`
}

// TestConfigReachesTheServer sets the core fields of beam.Config and sees
// each one take effect, on one directory with them set and one with the
// defaults (which also federates on an embedded NATS);
// TestEveryConfigFieldReachesTheAssembly checks that every field is mapped.
func TestConfigReachesTheServer(t *testing.T) {
	t.Parallel()
	_, err := beam.New(context.Background(), beam.Config{DataDir: t.TempDir(), DefaultPolicy: "sometimes"})
	require.ErrorContains(t, err, "sometimes", "the default policy reaches the registry's check")
	_, err = beam.New(context.Background(), beam.Config{DataDir: t.TempDir(), Federation: beam.Federation{Peers: []string{"not a peer line"}}})
	require.ErrorContains(t, err, "not a peer line")

	// plain: the defaults, plus an embedded NATS for federation.
	plain := serve(t, beam.Config{Domain: "plain.beam.directory", Federation: beam.Federation{NATSListen: "127.0.0.1:0"}})
	plainAdmin, _ := plain.srv.AdminToken()
	var plainSelf self
	plain.getJSON(t, "/federation/self", plainAdmin, http.StatusOK, &plainSelf)
	require.Equal(t, "plain.beam.directory", plainSelf.Domain)

	// An external NATS for the second directory's NATSURL, which admits it
	// by its directory key.
	dataDir := t.TempDir()
	priv, _, err := federation.LoadOrCreateKey(dataDir)
	require.NoError(t, err)
	nk, err := federation.NkeyUser(priv.Public().(ed25519.PublicKey))
	require.NoError(t, err)
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true,
		Nkeys: []*natsserver.NkeyUser{{Nkey: nk, Permissions: federation.SharedPermissions("full.beam.directory")}}})
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)

	var logged atomic.Int64
	future := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	offset := time.Until(future)
	full := serve(t, beam.Config{
		DataDir:               dataDir,
		AdminToken:            "bop_config-test-admin",
		DefaultPolicy:         "allow",
		AllowLegacyWSIdentity: true,
		Domain:                "full.beam.directory",
		Federation:            beam.Federation{NATSURL: ns.ClientURL(), Peers: []string{plainSelf.Line}},
		Bus:                   beam.Bus{APIKey: "bus-config-test-key"},
		NoLimits:              true,
		Logger:                slog.New(countingHandler{&logged}),
		Clock:                 func() time.Time { return time.Now().Add(offset) },
	})

	t.Run("DataDir holds the log", func(t *testing.T) {
		_, err := os.Stat(filepath.Join(dataDir, "beam.db"))
		require.NoError(t, err)
	})
	t.Run("AdminToken is the operator token", func(t *testing.T) {
		tok, generated := full.srv.AdminToken()
		require.Equal(t, "bop_config-test-admin", tok)
		require.False(t, generated)
		full.getJSON(t, "/v1/beam/dead-letter", tok, http.StatusOK, nil)
		_, generated = plain.srv.AdminToken()
		require.True(t, generated)
	})
	t.Run("Domain, NATSURL and Peers reach federation", func(t *testing.T) {
		var s self
		full.getJSON(t, "/federation/self", "bop_config-test-admin", http.StatusOK, &s)
		require.Equal(t, "full.beam.directory", s.Domain)
		var peers struct {
			Peers []struct {
				Domain string `json:"domain"`
			} `json:"peers"`
		}
		full.getJSON(t, "/federation/peers", "bop_config-test-admin", http.StatusOK, &peers)
		require.Len(t, peers.Peers, 1)
		require.Equal(t, "plain.beam.directory", peers.Peers[0].Domain)
		require.Equal(t, 1, ns.NumClients(), "the directory connects to the NATS at NATSURL")
	})
	t.Run("BusAPIKey opens the bus API", func(t *testing.T) {
		full.getJSON(t, "/v1/beam/stats", "bus-config-test-key", http.StatusOK, nil)
		plain.getJSON(t, "/v1/beam/stats", "bus-config-test-key", http.StatusUnauthorized, nil)
	})
	t.Run("Clock dates the answers", func(t *testing.T) {
		var h struct {
			Timestamp string `json:"timestamp"`
		}
		full.getJSON(t, "/health", "", http.StatusOK, &h)
		require.True(t, strings.HasPrefix(h.Timestamp, "2031-03-04T"), h.Timestamp)
	})
	t.Run("Logger receives the server's records", func(t *testing.T) {
		require.Positive(t, logged.Load())
	})
	t.Run("AllowLegacyWSIdentity admits an unproven WebSocket", func(t *testing.T) {
		full.wsAttach(t, "legacy@full.beam.directory")
		require.Eventually(t, func() bool {
			var h struct {
				ConnectedAgents int `json:"connectedAgents"`
			}
			full.getJSON(t, "/health", "", http.StatusOK, &h)
			return h.ConnectedAgents == 1
		}, 10*time.Second, 20*time.Millisecond)

		conn := plain.wsAttach(t, "legacy@plain.beam.directory")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _, err := conn.Read(ctx)
		require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "got %v", err)
	})
	t.Run("NoLimits drops the rate limits the defaults keep", func(t *testing.T) {
		require.True(t, plain.registerFlood(t, 40), "the default limits allow 30 registrations a minute")
		require.False(t, full.registerFlood(t, 40))
	})
}

// countingHandler counts the records it is given.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestEmbeddedPipelinesAreA2AAgents: pipelines declared in the Config are
// on the directory's A2A card; a malformed declaration stops New.
func TestEmbeddedPipelinesAreA2AAgents(t *testing.T) {
	t.Parallel()
	_, err := beam.New(context.Background(), beam.Config{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler),
		Pipelines: beam.Pipelines{Declared: []byte(`{"pipelines":[{"name":"x","route":["not a beam id"]}]}`)}})
	require.ErrorContains(t, err, `pipeline "x"`)

	r := serve(t, beam.Config{Pipelines: beam.Pipelines{Declared: []byte(`{"pipelines":[{"name":"greet","route":["bob@acme.beam.directory"]}]}`)}})
	resp, err := http.Get(r.url + "/.well-known/agent-card.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	var card struct {
		Skills []struct {
			ID string `json:"id"`
		} `json:"skills"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&card))
	require.Len(t, card.Skills, 1)
	require.Equal(t, "greet", card.Skills[0].ID)
}
