package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
)

// requireRateLimited checks a 429 in the Beam error shape with a
// Retry-After of at least one second.
func requireRateLimited(t *testing.T, status int, header http.Header, body []byte) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	var e struct {
		Error     string `json:"error"`
		ErrorCode string `json:"errorCode"`
	}
	require.NoError(t, json.Unmarshal(body, &e), string(body))
	require.Equal(t, "RATE_LIMITED", e.ErrorCode)
	require.NotEmpty(t, e.Error)
	secs, err := strconv.Atoi(header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", header.Get("Retry-After"))
	require.GreaterOrEqual(t, secs, 1)
}

func do(t *testing.T, method, u, bearer string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	var hdr []string
	if bearer != "" {
		hdr = []string{"Authorization", "Bearer " + bearer}
	}
	return httpCall(t, context.Background(), method, u, string(body), hdr...)
}

// TestRegistrationFloodIsRateLimited registers agents from one address
// until the per-address limit (set through its BEAM_* variable) answers 429.
func TestRegistrationFloodIsRateLimited(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Env: []string{"BEAM_LIMIT_REGISTER=3/1h"}})
	for i := range 3 {
		registerAgent(t, p.URL(), fmt.Sprintf("flood%d@acme.beam.directory", i))
	}
	pub, _, err := wire.GenerateKey()
	require.NoError(t, err)
	body, _ := json.Marshal(map[string]any{"beamId": "flood9@acme.beam.directory", "displayName": "x",
		"capabilities": []string{}, "publicKey": wire.EncodePublicKey(pub)})
	status, h, b := do(t, http.MethodPost, p.URL()+"/agents/register", "", body)
	requireRateLimited(t, status, h, b)
}

// TestIntentFloodIsRateLimitedPerSender: one agent's flood is refused with
// 429 while another agent still sends, and frames that only claim to be
// from the victim (bad signatures) do not use up the victim's allowance.
func TestIntentFloodIsRateLimitedPerSender(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--limit-intents", "3/1h"}})
	ctx := context.Background()
	victim := registerAgent(t, p.URL(), "victim@acme.beam.directory")
	other := registerAgent(t, p.URL(), "other@acme.beam.directory")
	forger := registerAgent(t, p.URL(), "forger@acme.beam.directory")

	for range 5 {
		forged := wire.NewIntentFrame(victim.id, "echo@beam.directory", "conversation.message", json.RawMessage(`{}`), time.Now())
		require.NoError(t, wire.SignIntent(forged, forger.priv))
		b, err := forged.DeliveryJSON()
		require.NoError(t, err)
		status, body, err := postIntent(ctx, p.URL(), b)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, status, string(body))
	}
	for range 3 {
		status, body, err := postIntent(ctx, p.URL(), victim.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"m": 1}))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, string(body))
	}
	status, h, b := do(t, http.MethodPost, p.URL()+"/intents/send", "", victim.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"m": 2}))
	requireRateLimited(t, status, h, b)

	// The same limit holds on a WebSocket session.
	c := victim.connect(t, ctx, p.URL())
	defer c.CloseNow()
	msg, err := json.Marshal(map[string]any{"type": "intent", "frame": json.RawMessage(victim.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"m": 3}))})
	require.NoError(t, err)
	require.NoError(t, c.Write(ctx, websocket.MessageText, msg))
	got := readWS(t, ctx, c)
	require.Contains(t, string(mustJSON(t, got)), "RATE_LIMITED")

	status, body, err := postIntent(ctx, p.URL(), other.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"m": 1}))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "another sender is not limited: %s", body)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// TestBusSendFloodIsRateLimited floods POST /v1/beam/send as one agent.
func TestBusSendFloodIsRateLimited(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: append([]string{"--limit-bus-sends", "2/1h"}, busArgs...)})
	sender := registerAgent(t, p.URL(), "bsender@acme.beam.directory")
	registerAgent(t, p.URL(), "bworker@acme.beam.directory")
	send := func() (int, http.Header, []byte) {
		return do(t, http.MethodPost, p.URL()+"/v1/beam/send", sender.apiKey,
			[]byte(`{"from":"bsender@acme.beam.directory","to":"bworker@acme.beam.directory","intent":"task.run"}`))
	}
	for range 2 {
		status, _, b := send()
		require.Equal(t, http.StatusCreated, status, string(b))
	}
	status, h, b := send()
	requireRateLimited(t, status, h, b)
}

// TestConnectFloodIsRateLimited opens WebSocket sessions from one address
// until the per-address connect limit answers 429.
func TestConnectFloodIsRateLimited(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--limit-connect", "2/1h"}})
	ctx := context.Background()
	a := registerAgent(t, p.URL(), "conn@acme.beam.directory")
	for range 2 {
		c := a.connect(t, ctx, p.URL())
		c.CloseNow()
	}
	u := strings.Replace(p.URL(), "http://", "ws://", 1) + "/ws?beamId=" + url.QueryEscape(a.id) + "&apiKey=" + url.QueryEscape(a.apiKey)
	_, resp, err := websocket.Dial(ctx, u, nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	b, _ := io.ReadAll(resp.Body)
	requireRateLimited(t, resp.StatusCode, resp.Header, b)
}

// TestSlowBodyConnectionsCannotHoldTheServer opens 200 connections from one
// address that send headers and then never the body. The per-address cap
// closes most at once, the read timeout closes the rest, and a client on
// another address is served throughout.
func TestSlowBodyConnectionsCannotHoldTheServer(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--max-conns-per-addr", "20", "--read-timeout", "2s"}})
	addr := strings.TrimPrefix(p.URL(), "http://")
	conns := make([]net.Conn, 0, 200)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 200 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
		_, err = fmt.Fprintf(c, "POST /intents/send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		require.NoError(t, err) // (a write can succeed on a connection the server already closed)
	}

	// Another address is served while the slow connections are open.
	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	resp, err := other.Get(p.URL() + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Every slow connection ends: refused by the cap or cut by the timeout.
	closed := 0
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "a slow connection was held for 20s")
			closed++
			continue
		}
		require.True(t, strings.HasPrefix(line, "HTTP/1.1 4"), "a held body ends in a client error, got %q", line)
		closed++
	}
	require.Equal(t, 200, closed)
}

// TestTimeoutsSpareLongExchanges runs with a 1 s body deadline and a 1 s
// response deadline: a WebSocket session keeps working well past both, and
// an HTTP send whose answer takes longer than the body deadline (but whose
// body arrived at once) still gets its result.
func TestTimeoutsSpareLongExchanges(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--read-timeout", "1s", "--write-timeout", "3s", "--open-orgs"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice := registerAgent(t, p.URL(), "alice@acme.beam.directory")
	bob := registerAgent(t, p.URL(), "bob@acme.beam.directory")

	// bob answers every intent, each after 1.5 s.
	bc := bob.connect(t, ctx, p.URL())
	defer bc.CloseNow()
	go func() {
		for {
			_, b, err := bc.Read(ctx)
			if err != nil {
				return
			}
			var m wsMessage
			if json.Unmarshal(b, &m) != nil || m.Type != "intent" {
				continue
			}
			var f struct {
				Nonce string `json:"nonce"`
			}
			if json.Unmarshal(m.Frame, &f) != nil {
				continue
			}
			time.AfterFunc(1500*time.Millisecond, func() {
				p, _ := json.Marshal(map[string]any{"late": true})
				res, err := wire.Result{Success: true, Nonce: f.Nonce, Payload: p}.Build(time.Now(), bob.priv)
				if err != nil {
					return
				}
				msg, _ := json.Marshal(map[string]any{"type": "result", "frame": json.RawMessage(res)})
				_ = bc.Write(ctx, websocket.MessageText, msg)
			})
		}
	}()

	start := time.Now()
	status, body, err := postIntent(ctx, p.URL(), alice.frame(t, bob.id, "task.run", map[string]any{"n": 1}))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Contains(t, string(body), "late")
	require.Greater(t, time.Since(start), time.Second, "the answer came after the body deadline")

	// alice's session outlives the response deadline: three exchanges of
	// 1.5 s each on one connection.
	ac := alice.connect(t, ctx, p.URL())
	defer ac.CloseNow()
	connected := time.Now()
	for i := range 3 {
		msg, err := json.Marshal(map[string]any{"type": "intent", "frame": json.RawMessage(alice.frame(t, bob.id, "task.run", map[string]any{"i": i}))})
		require.NoError(t, err)
		require.NoError(t, ac.Write(ctx, websocket.MessageText, msg))
		got := readWS(t, ctx, ac)
		require.Equal(t, "result", got.Type, "exchange %d: %+v", i, got)
	}
	require.Greater(t, time.Since(connected), 3*time.Second, "the session lived past the response deadline")
}
