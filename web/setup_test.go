package web

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

const (
	adminToken  = "bop_admin_test_token"
	viewerToken = "bop_viewer_test_token"
)

// bundle is one directory with its dashboard behind a real HTTP server:
// a real log file, a real registry, the relay and the dashboard routes.
type bundle struct {
	t    testing.TB
	log  *tracing.Log
	reg  *registry.Registry
	dir  *directory.Directory
	dash *Dashboard
	srv  *httptest.Server

	mu       sync.Mutex
	requeued []string
}

type setupOpts struct {
	cfg     func(*Config)
	noBus   bool // Config.Requeue stays nil
	clock   func() time.Time
	logSync string
	// streamBuffer lowers the SSE subscription buffer to provoke lag.
	streamBuffer int
}

func setup(t testing.TB, opts ...func(*setupOpts)) *bundle {
	t.Helper()
	o := &setupOpts{clock: time.Now, logSync: "NORMAL"}
	for _, fn := range opts {
		fn(o)
	}
	ctx := context.Background()
	quiet := beamtest.Logger(t)
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Clock: o.clock, Synchronous: o.logSync, Logger: quiet})
	require.NoError(t, err)
	reg, err := registry.Open(ctx, lg, registry.Config{Clock: o.clock, Logger: quiet, AllowInsecureEndpoints: true, OpenOrgs: true})
	require.NoError(t, err)
	dir, err := directory.New(directory.Config{Log: lg, Registry: reg, Clock: o.clock, Logger: quiet})
	require.NoError(t, err)
	b := &bundle{t: t, log: lg, reg: reg, dir: dir}
	cfg := Config{
		Log: lg, Registry: reg, Directory: dir, AdminToken: adminToken, ViewerToken: viewerToken,
		Clock: o.clock, Logger: quiet,
	}
	if !o.noBus {
		cfg.Requeue = b.requeue
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	dash, err := New(cfg)
	require.NoError(t, err)
	dash.streamBuffer = o.streamBuffer
	b.dash = dash
	mux := http.NewServeMux()
	reg.Routes(mux)
	dir.Routes(mux)
	dash.Routes(mux)
	b.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		b.srv.CloseClientConnections()
		_ = dir.Close()
		b.srv.Close()
		_ = reg.Close(context.Background())
		_ = lg.Close()
	})
	return b
}

// requeue stands in for the message bus: it moves a dead-lettered message
// back to queued through the log, as the bus's operator endpoint will.
func (b *bundle) requeue(ctx context.Context, id string) error {
	nonce, ok, err := b.log.MessageNonce(ctx, id)
	if err != nil || !ok {
		return fmt.Errorf("find message %s: found %v, %w", id, ok, err)
	}
	if _, err := b.log.Append(ctx, tracing.Event{Nonce: nonce, State: tracing.Queued, Transport: "bus",
		Details: tracing.Details{Extra: map[string]any{"requeuedBy": "operator"}}}); err != nil {
		return err
	}
	b.mu.Lock()
	b.requeued = append(b.requeued, id)
	b.mu.Unlock()
	return nil
}

func (b *bundle) url(path string) string { return b.srv.URL + path }

// client is an HTTP client of the test server that does not follow
// redirects and keeps cookies.
func (b *bundle) client() *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(b.t, err)
	return &http.Client{
		Jar:           jar,
		Timeout:       20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), string(r.body))
	return m
}

func (r reply) decode(t testing.TB, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), string(r.body))
}

func do(t testing.TB, c *http.Client, req *http.Request) reply {
	t.Helper()
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: body}
}

func (b *bundle) req(method, path string, body io.Reader, hdr ...string) *http.Request {
	req, err := http.NewRequest(method, b.url(path), body)
	require.NoError(b.t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// get sends a GET with a bearer token (empty: none).
func (b *bundle) get(path, token string) reply {
	b.t.Helper()
	req := b.req(http.MethodGet, path, nil, "Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return do(b.t, b.client(), req)
}

// operator is a logged-in browser session.
type operator struct {
	b    *bundle
	c    *http.Client
	csrf string
	role string
}

func (b *bundle) login(token string) *operator {
	b.t.Helper()
	c := b.client()
	req := b.req(http.MethodPost, "/dashboard/login", strings.NewReader(url.Values{"token": {token}}.Encode()),
		"Content-Type", "application/x-www-form-urlencoded", "Origin", b.srv.URL)
	r := do(b.t, c, req)
	require.Equal(b.t, http.StatusSeeOther, r.status, string(r.body))
	require.Equal(b.t, "/dashboard/", r.header.Get("Location"))
	s := do(b.t, c, b.req(http.MethodGet, "/dashboard/session", nil))
	require.Equal(b.t, http.StatusOK, s.status, string(s.body))
	var sv sessionView
	s.decode(b.t, &sv)
	require.NotEmpty(b.t, sv.CSRFToken)
	return &operator{b: b, c: c, csrf: sv.CSRFToken, role: sv.Role}
}

func (o *operator) get(path string) reply {
	o.b.t.Helper()
	return do(o.b.t, o.c, o.b.req(http.MethodGet, path, nil, "Accept", "application/json"))
}

// post sends a same-origin POST with the session's CSRF token.
func (o *operator) post(path string, hdr ...string) reply {
	o.b.t.Helper()
	req := o.b.req(http.MethodPost, path, nil, append([]string{"Origin", o.b.srv.URL, csrfHeader, o.csrf}, hdr...)...)
	return do(o.b.t, o.c, req)
}

// Log fixtures.

var baseTime = time.Now().UTC().Add(-10 * time.Minute).Truncate(time.Millisecond)

func msPtr(v int64) *int64 { return &v }
func intPtr(v int) *int    { return &v }

// appendFlow appends a directory intent that walks states, with event
// times spaced by step from at.
func (b *bundle) appendFlow(nonce, from, to, typ string, at time.Time, step time.Duration, states ...tracing.State) []tracing.Event {
	b.t.Helper()
	evs := make([]tracing.Event, len(states))
	for i, s := range states {
		ev := tracing.Event{Nonce: nonce, State: s, At: at.Add(time.Duration(i) * step), Transport: "ws", Attempt: 1}
		switch s {
		case tracing.Received:
			ev.From, ev.To, ev.IntentType = from, to, typ
			ev.Details.Frame = json.RawMessage(fmt.Sprintf(`{"v":"1","nonce":%q,"from":%q,"to":%q,"intent":%q,"payload":{"n":1}}`, nonce, from, to, typ))
			ev.Details.ClientTimestamp = at.Format(time.RFC3339Nano)
		case tracing.Dispatched:
			ev.Details.TimeoutMs = 30000
		case tracing.Acked:
			ev.Details.Result = json.RawMessage(fmt.Sprintf(`{"v":"1","success":true,"nonce":%q,"payload":{"ok":true}}`, nonce))
			ev.Details.LatencyMs = msPtr(int64(step/time.Millisecond) * int64(i))
		case tracing.Failed:
			ev.Details.ErrorCode, ev.Details.Error = "OFFLINE", "agent offline"
		}
		evs[i] = ev
	}
	out, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
	return out
}

// appendDeadLetter appends a bus message that ends in dead_letter.
func (b *bundle) appendDeadLetter(nonce, id string, at time.Time) {
	b.t.Helper()
	evs := []tracing.Event{
		{Nonce: nonce, State: tracing.Received, At: at, From: "alice@acme.beam.directory", To: "bob@acme.beam.directory",
			IntentType: "task.run", Transport: "bus", Details: tracing.Details{Owner: tracing.OwnerBus,
				Bus: &tracing.BusMessage{MessageID: id, Payload: json.RawMessage(`{"job":"x"}`), MaxRetries: 2}}},
		{Nonce: nonce, State: tracing.Dispatched, At: at.Add(time.Second), Transport: "bus", Attempt: 1},
		{Nonce: nonce, State: tracing.Queued, At: at.Add(2 * time.Second), Transport: "bus", Attempt: 1,
			Details: tracing.Details{ErrorCode: "OFFLINE", Error: "agent offline", RetryCount: intPtr(1), NextRetryAt: at.Add(time.Minute).UnixMilli()}},
		{Nonce: nonce, State: tracing.Dispatched, At: at.Add(3 * time.Second), Transport: "bus", Attempt: 2},
		{Nonce: nonce, State: tracing.DeadLetter, At: at.Add(4 * time.Second), Transport: "bus", Attempt: 2,
			Details: tracing.Details{ErrorCode: "OFFLINE", Error: "retries exhausted", RetryCount: intPtr(2)}},
	}
	_, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
}

// Agents over the real registry and relay.

type agent struct {
	id   string
	priv ed25519.PrivateKey
}

func (b *bundle) register(name string) *agent {
	b.t.Helper()
	pub, priv, err := wire.GenerateKey()
	require.NoError(b.t, err)
	id := name + "@acme.beam.directory"
	body, _ := json.Marshal(map[string]any{"beamId": id, "displayName": name, "capabilities": []string{"test"}, "publicKey": wire.EncodePublicKey(pub)})
	r := do(b.t, b.client(), b.req(http.MethodPost, "/agents/register", bytes.NewReader(body), "Content-Type", "application/json"))
	require.Equal(b.t, http.StatusCreated, r.status, string(r.body))
	return &agent{id: id, priv: priv}
}

// sendEcho sends a signed intent to echo@beam.directory through POST
// /intents/send and returns its nonce.
func (b *bundle) sendEcho(a *agent, intent string) string {
	b.t.Helper()
	f := wire.NewIntentFrame(a.id, registry.EchoBeamID, intent, json.RawMessage(`{"message":"hello"}`), time.Now())
	require.NoError(b.t, wire.SignIntent(f, a.priv))
	raw, err := f.DeliveryJSON()
	require.NoError(b.t, err)
	r := do(b.t, b.client(), b.req(http.MethodPost, "/intents/send", bytes.NewReader(raw), "Content-Type", "application/json"))
	require.Equal(b.t, http.StatusOK, r.status, string(r.body))
	return f.Nonce
}

// SSE client.

type sseEvent struct {
	id    int64
	event string
	data  []byte
}

type sseConn struct {
	resp   *http.Response
	events chan sseEvent
	done   chan error
	cancel context.CancelFunc
	// comments counts comment lines (keepalives).
	comments atomic.Int64
}

// openSSE connects to the stream with a bearer token and, when lastID >= 0,
// Last-Event-ID.
func (b *bundle) openSSE(lastID int64, query string) *sseConn {
	b.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url("/observability/stream"+query), nil)
	require.NoError(b.t, err)
	req.Header.Set("Authorization", "Bearer "+viewerToken)
	req.Header.Set("Accept", "text/event-stream")
	if lastID >= 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(lastID, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	require.Equal(b.t, http.StatusOK, resp.StatusCode)
	require.Equal(b.t, "text/event-stream", resp.Header.Get("Content-Type"))
	c := &sseConn{resp: resp, events: make(chan sseEvent, 1<<16), done: make(chan error, 1), cancel: cancel}
	go c.read()
	b.t.Cleanup(c.close)
	return c
}

func (c *sseConn) read() {
	defer close(c.events)
	r := bufio.NewReader(c.resp.Body)
	var cur sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			c.done <- err
			return
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if cur.event != "" || cur.data != nil {
				c.events <- cur
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			c.comments.Add(1)
		case strings.HasPrefix(line, "id: "):
			cur.id, _ = strconv.ParseInt(strings.TrimPrefix(line, "id: "), 10, 64)
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = []byte(strings.TrimPrefix(line, "data: "))
		}
	}
}

func (c *sseConn) close() {
	c.cancel()
	_ = c.resp.Body.Close()
}

// next waits for the next event, failing the test after timeout.
func (c *sseConn) next(t testing.TB, timeout time.Duration) (sseEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-c.events:
		return ev, ok
	case <-time.After(timeout):
		require.FailNow(t, "no SSE event in time")
		return sseEvent{}, false
	}
}
