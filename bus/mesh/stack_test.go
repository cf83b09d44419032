package mesh_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// stack is one in-process directory (package beam) behind an
// httptest server: real log, registry, directory, pipelines and, when
// configured, federation on embedded NATS.
type stack struct {
	t   *testing.T
	srv *beam.Server
	url string
}

func startStack(t *testing.T, cfg beam.Config) *stack {
	t.Helper()
	cfg.DataDir = t.TempDir()
	cfg.Synchronous = "NORMAL"
	cfg.OpenOrgs = true
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Pipelines.HopTimeout == 0 {
		cfg.Pipelines.HopTimeout = 10 * time.Second
	}
	cfg.Limits = &beam.Limits{}
	srv, err := beam.New(context.Background(), cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		hs.Close()
	})
	return &stack{t: t, srv: srv, url: hs.URL}
}

// agent registers beamID and returns its identity (API key included) and a
// client that is not connected yet.
func (s *stack) agent(beamID string) (*agents.Identity, *agents.Client) {
	s.t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(s.t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: s.url, Identity: id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = c.Close() })
	res, err := c.Register(context.Background(), beamID, []string{"test"})
	require.NoError(s.t, err)
	id.APIKey = res.APIKey
	return id, c
}

// actor registers beamID, handles pipeline hops with h and connects.
func (s *stack) actor(beamID string, h agents.MeshHandler) {
	s.t.Helper()
	_, c := s.agent(beamID)
	c.HandleMesh(h)
	require.NoError(s.t, c.Connect(context.Background()))
}

// call makes a gateway request; auth sets its credentials.
func (s *stack) call(method, path string, body []byte, auth func(*http.Request, []byte)) (int, []byte) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, bytes.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	if auth != nil {
		auth(req, body)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, out
}

// view is GET /api/v1/mesh/{id}.
type view struct {
	tracing.MeshRow
	Envelope viewEnvelope `json:"envelope"`
}

// viewEnvelope is the SDK's envelope with the status member kept as it
// was written, so that tests see which of its keys are present.
type viewEnvelope struct {
	agents.MeshEnvelope
	Status json.RawMessage `json:"status"`
}

// wait polls envelope id until it is terminal.
func (s *stack) wait(id string, auth func(*http.Request, []byte)) view {
	s.t.Helper()
	var v view
	require.Eventually(s.t, func() bool {
		status, out := s.call(http.MethodGet, "/api/v1/mesh/"+id, nil, auth)
		require.Equal(s.t, http.StatusOK, status, string(out))
		require.NoError(s.t, json.Unmarshal(out, &v))
		return v.Status.Terminal()
	}, 60*time.Second, 20*time.Millisecond, "envelope %s reaches a terminal status", id)
	return v
}

// errorCode decodes the Beam error shape.
func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error     string `json:"error"`
		ErrorCode string `json:"errorCode"`
	}
	require.NoError(t, json.Unmarshal(body, &e), string(body))
	require.NotEmpty(t, e.Error, string(body))
	return e.ErrorCode
}
