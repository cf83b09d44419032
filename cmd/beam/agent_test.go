package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

// testAgent is a registered agent that speaks the wire protocol directly, so
// the process tests depend on nothing but the directory's public surface.
type testAgent struct {
	id     string
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
	apiKey string
}

func registerAgent(t *testing.T, baseURL, beamID string) *testAgent {
	t.Helper()
	pub, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{
		"beamId": beamID, "displayName": beamID, "capabilities": []string{},
		"publicKey": wire.EncodePublicKey(pub),
	})
	require.NoError(t, err)
	resp, err := http.Post(baseURL+"/agents/register", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(b))
	var out struct {
		APIKey string `json:"apiKey"`
	}
	require.NoError(t, json.Unmarshal(b, &out))
	require.True(t, strings.HasPrefix(out.APIKey, "bk_"))
	return &testAgent{id: beamID, pub: pub, priv: priv, apiKey: out.APIKey}
}

// frame returns a signed intent frame from a to `to`.
func (a *testAgent) frame(t *testing.T, to, intent string, payload any) []byte {
	t.Helper()
	p, err := json.Marshal(payload)
	require.NoError(t, err)
	f := wire.NewIntentFrame(a.id, to, intent, p, time.Now())
	require.NoError(t, wire.SignIntent(f, a.priv))
	b, err := f.DeliveryJSON()
	require.NoError(t, err)
	return b
}

// postIntent sends a frame to POST /intents/send and returns the status and
// body. A transport error is returned as status 0.
func postIntent(ctx context.Context, baseURL string, frame []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/intents/send", bytes.NewReader(frame))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// wsMessage is any message the directory sends over a session.
type wsMessage struct {
	Type            string          `json:"type"`
	Frame           json.RawMessage `json:"frame"`
	SenderPublicKey string          `json:"senderPublicKey"`
	ErrorCode       string          `json:"errorCode"`
	Message         string          `json:"message"`
}

// connect opens an authenticated session for a and waits for `connected`.
func (a *testAgent) connect(t *testing.T, ctx context.Context, baseURL string) *websocket.Conn {
	t.Helper()
	u := strings.Replace(baseURL, "http://", "ws://", 1) + "/ws?beamId=" + url.QueryEscape(a.id) + "&apiKey=" + url.QueryEscape(a.apiKey)
	c, _, err := websocket.Dial(ctx, u, nil)
	require.NoError(t, err)
	msg := readWS(t, ctx, c)
	require.Equal(t, "connected", msg.Type)
	return c
}

func readWS(t *testing.T, ctx context.Context, c *websocket.Conn) wsMessage {
	t.Helper()
	_, b, err := c.Read(ctx)
	require.NoError(t, err)
	var m wsMessage
	require.NoError(t, json.Unmarshal(b, &m), string(b))
	return m
}

// respond sends a signed success result for nonce with payload.
func (a *testAgent) respond(t *testing.T, ctx context.Context, c *websocket.Conn, nonce string, payload any) {
	t.Helper()
	p, err := json.Marshal(payload)
	require.NoError(t, err)
	res, err := wire.Result{Success: true, Nonce: nonce, Payload: p}.Build(time.Now(), a.priv)
	require.NoError(t, err)
	msg, err := json.Marshal(map[string]any{"type": "result", "frame": json.RawMessage(res)})
	require.NoError(t, err)
	require.NoError(t, c.Write(ctx, websocket.MessageText, msg))
}

// httpGetJSON GETs url into v and returns the status code.
func httpGetJSON(url string, v any) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}
