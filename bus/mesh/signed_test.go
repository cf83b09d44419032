package mesh_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// TestGatewaySignedRequests: an agent authenticates to the gateway by an
// Ed25519 signature over the request (method, path, body hash, timestamp,
// nonce) instead of its API key. A valid signature is accepted once; a bad
// signature, a replayed nonce, a stale timestamp, a changed body or path,
// and an unknown signer are refused with clear 4xx errors.
func TestGatewaySignedRequests(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{})
	creator, _ := s.agent("creator@alpha.beam.directory")
	stranger, _ := s.agent("stranger@alpha.beam.directory")
	s.actor("echo@alpha.beam.directory", func(ctx context.Context, h *agents.MeshHop) (any, error) {
		return h.Envelope.Payload, nil
	})
	signed := func(id *agents.Identity, at time.Time) func(*http.Request, []byte) {
		return func(r *http.Request, body []byte) { require.NoError(t, agents.SignMeshRequest(r, body, id, at)) }
	}
	now := time.Now

	body := []byte(`{"route":["echo@alpha.beam.directory"],"payload":{"n":1}}`)
	status, out := s.call(http.MethodPost, "/api/v1/mesh", body, signed(creator, now()))
	require.Equal(t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &created))
	v := s.wait(created.ID, signed(creator, now()))
	require.Equal(t, tracing.MeshSucceeded, v.Status)
	require.Equal(t, creator.BeamID, v.Creator, "the signer is the authenticated creator")
	require.JSONEq(t, `{"n":1}`, string(v.Envelope.Payload))

	// A replay of the same signed request (same headers, same body).
	var first http.Header
	status, out = s.call(http.MethodPost, "/api/v1/mesh", body, func(r *http.Request, b []byte) {
		signed(creator, now())(r, b)
		first = r.Header.Clone()
	})
	require.Equal(t, http.StatusCreated, status, string(out))
	replay := func(r *http.Request, _ []byte) {
		for k, v := range first {
			r.Header[k] = v
		}
	}

	// A signature by another key under the creator's name.
	impostor, err := agents.GenerateIdentity(creator.BeamID)
	require.NoError(t, err)
	tampered := func(r *http.Request, b []byte) {
		signed(creator, now())(r, []byte(`{"route":["echo@alpha.beam.directory"],"payload":{"n":2}}`))
	}
	otherPath := func(r *http.Request, b []byte) {
		signed(creator, now())(r, b)
		r.URL.Path = "/api/v1/mesh/" + created.ID + "/cancel"
	}
	unknown, err := agents.GenerateIdentity("nobody@alpha.beam.directory")
	require.NoError(t, err)
	cases := []struct {
		name, method, path string
		body               []byte
		auth               func(*http.Request, []byte)
		status             int
		code               string
	}{
		{"replayed nonce", "POST", "/api/v1/mesh", body, replay, 409, "NONCE_REUSED"},
		{"bad signature", "POST", "/api/v1/mesh", body, signed(impostor, now()), 401, "INVALID_SIGNATURE"},
		{"stale timestamp", "POST", "/api/v1/mesh", body, signed(creator, now().Add(-10*time.Minute)), 401, "STALE_TIMESTAMP"},
		{"future timestamp", "POST", "/api/v1/mesh", body, signed(creator, now().Add(10*time.Minute)), 401, "STALE_TIMESTAMP"},
		{"body changed after signing", "POST", "/api/v1/mesh", body, tampered, 401, "INVALID_SIGNATURE"},
		{"path changed after signing", "POST", "/api/v1/mesh/" + created.ID + "/pause", nil, otherPath, 401, "INVALID_SIGNATURE"},
		{"unknown signer", "GET", "/api/v1/mesh", nil, signed(unknown, now()), 401, "UNAUTHORIZED"},
		{"no nonce", "GET", "/api/v1/mesh", nil, func(r *http.Request, b []byte) {
			signed(creator, now())(r, b)
			r.Header.Del("X-Beam-Nonce")
		}, 400, "INVALID_NONCE"},
		{"a stranger's signature sees nothing", "DELETE", "/api/v1/mesh/" + created.ID, nil, signed(stranger, now()), 404, "NOT_FOUND"},
	}
	for _, c := range cases {
		status, out := s.call(c.method, c.path, c.body, c.auth)
		require.Equal(t, c.status, status, "%s: %s", c.name, out)
		require.Equal(t, c.code, errorCode(t, out), c.name)
	}

	// Signed control of one's own envelope: pause a pending one, then
	// cancel it; signed reads of lists.
	status, out = s.call(http.MethodPost, "/api/v1/mesh",
		[]byte(`{"route":["creator@alpha.beam.directory"],"payload":{}}`), signed(creator, now()))
	require.Equal(t, http.StatusCreated, status, string(out))
	require.NoError(t, json.Unmarshal(out, &created))
	status, out = s.call(http.MethodDelete, "/api/v1/mesh/"+created.ID, nil, signed(creator, now()))
	require.Equal(t, http.StatusOK, status, string(out))
	status, out = s.call(http.MethodGet, "/api/v1/mesh?status=canceled", nil, signed(creator, now()))
	require.Equal(t, http.StatusOK, status, string(out))
	require.Contains(t, string(out), created.ID)
	status, out = s.call(http.MethodGet, "/api/v1/mesh", nil, signed(stranger, now()))
	require.Equal(t, http.StatusOK, status, string(out))
	require.Contains(t, string(out), `"total":0`)
}

// TestFlySignedWithoutAPIKey: an actor whose client holds no API key
// streams FLY events by signing the request with its key; the creator's
// stream gets them.
func TestFlySignedWithoutAPIKey(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{})
	creator, _ := s.agent("creator@alpha.beam.directory")
	ident, reg := s.agent("streamer@alpha.beam.directory")
	require.NoError(t, reg.Close())
	keyless := *ident
	keyless.APIKey = ""
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: s.url, Identity: &keyless})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	flyErr := make(chan error, 1)
	c.HandleMesh(func(ctx context.Context, h *agents.MeshHop) (any, error) {
		flyErr <- h.Fly(ctx, map[string]any{"token": "signed"})
		return h.Envelope.Payload, nil
	})

	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	status, out := s.call(http.MethodPost, "/api/v1/mesh", []byte(`{"route":["streamer@alpha.beam.directory"],"payload":{}}`), auth)
	require.Equal(t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &created))
	events := s.events(created.ID, auth)
	require.NoError(t, c.Connect(context.Background())) // the actor comes online: the hop runs
	require.NoError(t, <-flyErr)
	var fly []string
	for ev := range events {
		if ev.name == "fly" {
			fly = append(fly, ev.data)
		}
	}
	require.Equal(t, []string{`{"token":"signed"}`}, fly)
	require.Equal(t, tracing.MeshSucceeded, s.wait(created.ID, auth).Status)
}

// TestEventsStartWithStatus: the SSE stream of an envelope opens with its
// current row (event: status), before any progress event.
func TestEventsStartWithStatus(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{})
	creator, _ := s.agent("creator@alpha.beam.directory")
	s.actor("first@alpha.beam.directory", enrich("a", 1))
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	status, out := s.call(http.MethodPost, "/api/v1/mesh", []byte(`{"route":["first@alpha.beam.directory"],"payload":{}}`), auth)
	require.Equal(t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &created))
	require.Equal(t, tracing.MeshSucceeded, s.wait(created.ID, auth).Status)
	var names []string
	for ev := range s.events(created.ID, auth) {
		names = append(names, ev.name)
	}
	require.Equal(t, []string{"status"}, names, "the stream of a finished envelope is its row, progress in it")
}
