package a2a_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
)

const (
	pushPrep = "prep@acme.beam.directory"
	pushPost = "post@acme.beam.directory"
	pushHold = "hold@acme.beam.directory"
)

// pushStack is one in-process directory serving the pipelines "enrich"
// (prep, post) and "hold" (an actor that never answers), with the agent
// "client@acme.beam.directory" calling it.
type pushStack struct {
	t   *testing.T
	url string
	key string // the client's API key
	// seen gets the raw envelope of every hop an actor received.
	seen chan []byte
	// stop shuts the directory down (Cleanup does it too).
	stop func()
}

func startPushStack(t *testing.T, allowPrivate bool) *pushStack {
	t.Helper()
	return startPushStackIn(t, t.TempDir(), allowPrivate, "")
}

// startPushStackIn starts the stack on data directory dir; with key set,
// the agents are registered already (a restart) and key is the client's.
func startPushStackIn(t *testing.T, dir string, allowPrivate bool, key string) *pushStack {
	t.Helper()
	pipes := []byte(`{"pipelines":[{"name":"enrich","route":["` + pushPrep + `","` + pushPost + `"]},
	  {"name":"hold","route":["` + pushHold + `"]}]}`)
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := beam.New(context.Background(), beam.Config{DataDir: dir, Synchronous: "NORMAL", OpenOrgs: true, Limits: &beam.Limits{},
		DefaultPolicy: "allow", Logger: lg, Pipelines: beam.Pipelines{Declared: pipes}, AllowPrivateEndpoints: allowPrivate})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		hs.Close()
	})
	s := &pushStack{t: t, url: hs.URL, seen: make(chan []byte, 64), stop: func() {
		hs.CloseClientConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		hs.Close()
	}}
	if key != "" {
		s.key = key
		return s
	}
	s.key = s.agent("client@acme.beam.directory", nil)
	s.agent(pushPrep, func(_ context.Context, h *agents.MeshHop) (any, error) {
		m := map[string]any{}
		require.NoError(t, h.Bind(&m))
		m["prepared"] = true
		return m, nil
	})
	s.agent(pushPost, func(_ context.Context, h *agents.MeshHop) (any, error) {
		m := map[string]any{}
		require.NoError(t, h.Bind(&m))
		m["posted"] = true
		return m, nil
	})
	s.agent(pushHold, func(ctx context.Context, _ *agents.MeshHop) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	return s
}

// agent registers beamID and, with h, connects it as an actor that
// records every envelope it gets; it returns the API key.
func (s *pushStack) agent(beamID string, h agents.MeshHandler) string {
	s.t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(s.t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: s.url, Identity: id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = c.Close() })
	res, err := c.Register(context.Background(), beamID, []string{"test"})
	require.NoError(s.t, err)
	if h != nil {
		c.HandleMesh(func(ctx context.Context, hop *agents.MeshHop) (any, error) {
			raw, _ := json.Marshal(hop.Envelope)
			s.seen <- raw
			return h(ctx, hop)
		})
		require.NoError(s.t, c.Connect(context.Background()))
	}
	return res.APIKey
}

// rpc calls method on the pipeline's JSON-RPC endpoint and returns the
// result or the error.
func (s *pushStack) rpc(pipeline, method string, params any) (json.RawMessage, *struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Reason string `json:"reason"`
	} `json:"data"`
}) {
	s.t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	require.NoError(s.t, err)
	req, err := http.NewRequest(http.MethodPost, s.url+"/a2a/pipelines/"+pipeline, bytes.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Reason string `json:"reason"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(s.t, json.NewDecoder(resp.Body).Decode(&out))
	return out.Result, out.Error
}

// rest makes an HTTP+JSON binding request and returns its status and body.
func (s *pushStack) rest(method, path, body string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, string(out)
}

// sentTask is a 1.0 SendMessage result.
type sentTask struct {
	Task struct {
		ID string `json:"id"`
	} `json:"task"`
}

func taskOf(t *testing.T, res json.RawMessage) sentTask {
	t.Helper()
	var sent sentTask
	require.NoError(t, json.Unmarshal(res, &sent), string(res))
	return sent
}

// notification is one request the webhook got.
type notification struct {
	token, auth string
	body        []byte
}

// webhook is a local receiver of push notifications.
func webhook(t *testing.T) (*httptest.Server, <-chan notification) {
	t.Helper()
	ch := make(chan notification, 64)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- notification{token: r.Header.Get("X-A2A-Notification-Token"), auth: r.Header.Get("Authorization"), body: b}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hs.Close)
	return hs, ch
}

func message(data string) map[string]any {
	return map[string]any{"messageId": "m1", "role": "ROLE_USER", "parts": []any{map[string]any{"data": json.RawMessage(data)}}}
}

// TestA2APushNotificationsReachTheWebhook: a task sent with a push
// notification config (1.0 and 0.3) notifies the webhook at each change of
// status, in order, ending with completed and the enriched payload, each
// with the config's token and credentials; the actors never see the
// config. The config calls create, get, list and delete a task's configs.
func TestA2APushNotificationsReachTheWebhook(t *testing.T) {
	t.Parallel()
	s := startPushStack(t, true)
	hook, got := webhook(t)

	res, rerr := s.rpc("enrich", "SendMessage", map[string]any{"message": message(`{"n":1}`),
		"configuration": map[string]any{"returnImmediately": true, "taskPushNotificationConfig": map[string]any{
			"url": hook.URL + "/v10", "token": "tok-10", "authentication": map[string]any{"scheme": "Bearer", "credentials": "cred-10"}}}})
	require.Nil(t, rerr)
	sent := taskOf(t, res)
	order := map[string]int{"TASK_STATE_SUBMITTED": 0, "TASK_STATE_WORKING": 1, "TASK_STATE_COMPLETED": 3}
	last := -1
	for done := false; !done; {
		select {
		case n := <-got:
			require.Equal(t, "tok-10", n.token)
			require.Equal(t, "Bearer cred-10", n.auth)
			var body struct {
				Task struct {
					ID        string `json:"id"`
					Status    struct{ State string }
					Artifacts []struct {
						Parts []struct {
							Data map[string]any `json:"data"`
						} `json:"parts"`
					} `json:"artifacts"`
				} `json:"task"`
			}
			require.NoError(t, json.Unmarshal(n.body, &body), string(n.body))
			require.Equal(t, sent.Task.ID, body.Task.ID)
			rank, ok := order[body.Task.Status.State]
			require.True(t, ok, body.Task.Status.State)
			require.Greater(t, rank, last, "notifications arrive in order, one per status")
			last = rank
			if body.Task.Status.State == "TASK_STATE_COMPLETED" {
				require.NotEmpty(t, body.Task.Artifacts)
				require.Equal(t, map[string]any{"n": 1.0, "prepared": true, "posted": true}, body.Task.Artifacts[0].Parts[0].Data)
				done = true
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no completed notification")
		}
	}

	// 0.3: message/send with pushNotificationConfig; the task is the body.
	res, rerr = s.rpc("enrich", "message/send", map[string]any{"message": map[string]any{"kind": "message", "messageId": "m2",
		"role": "user", "parts": []any{map[string]any{"kind": "data", "data": map[string]any{"n": 2}}}},
		"configuration": map[string]any{"blocking": false, "pushNotificationConfig": map[string]any{
			"url": hook.URL + "/v03", "token": "tok-03", "authentication": map[string]any{"schemes": []string{"Bearer"}, "credentials": "cred-03"}}}})
	require.Nil(t, rerr)
	var states []string
	for len(states) == 0 || states[len(states)-1] != "completed" {
		select {
		case n := <-got:
			require.Equal(t, "tok-03", n.token)
			require.Equal(t, "Bearer cred-03", n.auth)
			var body struct {
				Kind   string `json:"kind"`
				Status struct{ State string }
			}
			require.NoError(t, json.Unmarshal(n.body, &body), string(n.body))
			require.Equal(t, "task", body.Kind)
			states = append(states, body.Status.State)
		case <-time.After(30 * time.Second):
			t.Fatalf("no completed notification: %v", states)
		}
	}
	_ = res

	// The config calls, on a task that waits for ever.
	res, rerr = s.rpc("hold", "SendMessage", map[string]any{"message": message(`{}`),
		"configuration": map[string]any{"returnImmediately": true}})
	require.Nil(t, rerr)
	task := taskOf(t, res).Task.ID
	res, rerr = s.rpc("hold", "CreateTaskPushNotificationConfig", map[string]any{"taskId": task, "id": "c1", "url": hook.URL + "/c1", "token": "t1"})
	require.Nil(t, rerr)
	require.JSONEq(t, `{"taskId":"`+task+`","id":"c1","url":"`+hook.URL+`/c1","token":"t1"}`, string(res))
	n := <-got // the task's current state
	require.Equal(t, "t1", n.token)
	res, rerr = s.rpc("hold", "GetTaskPushNotificationConfig", map[string]any{"taskId": task, "id": "c1"})
	require.Nil(t, rerr)
	require.Contains(t, string(res), `"url":"`+hook.URL+`/c1"`)
	res, rerr = s.rpc("hold", "tasks/pushNotificationConfig/list", map[string]any{"id": task})
	require.Nil(t, rerr)
	require.JSONEq(t, `[{"taskId":"`+task+`","pushNotificationConfig":{"id":"c1","url":"`+hook.URL+`/c1","token":"t1"}}]`, string(res))
	_, rerr = s.rpc("hold", "DeleteTaskPushNotificationConfig", map[string]any{"taskId": task, "id": "c1"})
	require.Nil(t, rerr)
	res, rerr = s.rpc("hold", "ListTaskPushNotificationConfigs", map[string]any{"taskId": task})
	require.Nil(t, rerr)
	require.JSONEq(t, `{"configs":[],"nextPageToken":""}`, string(res))
	_, rerr = s.rpc("hold", "GetTaskPushNotificationConfig", map[string]any{"taskId": task, "id": "c1"})
	require.NotNil(t, rerr)

	// The HTTP+JSON binding's routes.
	base := "/a2a/pipelines/hold/tasks/" + task + "/pushNotificationConfigs"
	code, out := s.rest(http.MethodPost, base, `{"id":"r1","url":"`+hook.URL+`/r1"}`)
	require.Equal(t, http.StatusOK, code, out)
	require.JSONEq(t, `{"taskId":"`+task+`","id":"r1","url":"`+hook.URL+`/r1"}`, out)
	code, out = s.rest(http.MethodGet, base, "")
	require.Equal(t, http.StatusOK, code, out)
	require.Contains(t, out, `"id":"r1"`)
	code, out = s.rest(http.MethodDelete, base+"/r1", "")
	require.Equal(t, http.StatusOK, code, out)
	code, _ = s.rest(http.MethodGet, base+"/r1", "")
	require.Equal(t, http.StatusNotFound, code)

	// No actor saw a webhook, a token or a credential.
	close(s.seen)
	hops := 0
	for raw := range s.seen {
		hops++
		for _, secret := range []string{hook.URL, "tok-", "cred-"} {
			require.NotContains(t, string(raw), secret)
		}
	}
	require.GreaterOrEqual(t, hops, 4)
}

// TestA2APushWebhookMustBePublic: ATTACK — a caller names a webhook on the
// directory's own host or network to make it send requests there (SSRF).
// Without --allow-private-endpoints, loopback, private and link-local
// addresses, localhost and plain http are refused when the config is set,
// with SendMessage (no task is created) and CreateTaskPushNotificationConfig
// alike, and nothing reaches the receiver.
func TestA2APushWebhookMustBePublic(t *testing.T) {
	t.Parallel()
	s := startPushStack(t, false)
	hook, got := webhook(t)
	res, rerr := s.rpc("hold", "SendMessage", map[string]any{"message": message(`{}`),
		"configuration": map[string]any{"returnImmediately": true}})
	require.Nil(t, rerr)
	sent := taskOf(t, res)
	for _, u := range []string{hook.URL, strings.Replace(hook.URL, "http://", "https://", 1), "https://localhost/hook",
		"https://10.1.2.3/hook", "https://192.168.0.1/hook", "https://169.254.169.254/latest/meta-data", "https://[::1]/hook",
		"https://[fd00::1]/hook", "https://[::ffff:127.0.0.1]/hook", "https://user:pw@example.com/hook"} {
		_, rerr := s.rpc("enrich", "SendMessage", map[string]any{"message": message(`{"n":1}`),
			"configuration": map[string]any{"returnImmediately": true, "taskPushNotificationConfig": map[string]any{"url": u}}})
		require.NotNil(t, rerr, u)
		require.Equal(t, "INVALID_PARAMS", rerr.Data.Reason, "%s: %s", u, rerr.Message)
		_, rerr = s.rpc("hold", "CreateTaskPushNotificationConfig", map[string]any{"taskId": sent.Task.ID, "url": u})
		require.NotNil(t, rerr, u)
		require.Equal(t, "INVALID_PARAMS", rerr.Data.Reason, "%s: %s", u, rerr.Message)
	}
	res, rerr = s.rpc("enrich", "ListTasks", map[string]any{})
	require.Nil(t, rerr)
	require.Contains(t, string(res), `"totalSize":0`, "no task was created for a refused webhook")
	select {
	case n := <-got:
		t.Fatalf("the private receiver got a request: %s", n.body)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestA2APushConfigsAreTheOwners: ATTACK — another agent reads or sets
// the push notification configs of a task it does not own: task not
// found, as for its other calls.
func TestA2APushConfigsAreTheOwners(t *testing.T) {
	t.Parallel()
	s := startPushStack(t, true)
	hook, _ := webhook(t)
	res, rerr := s.rpc("hold", "SendMessage", map[string]any{"message": message(`{}`),
		"configuration": map[string]any{"returnImmediately": true, "taskPushNotificationConfig": map[string]any{"id": "mine", "url": hook.URL, "token": "secret"}}})
	require.Nil(t, rerr)
	sent := taskOf(t, res)
	s.key = s.agent("mallory@acme.beam.directory", nil)
	for _, m := range []string{"GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig", "CreateTaskPushNotificationConfig"} {
		res, rerr := s.rpc("hold", m, map[string]any{"taskId": sent.Task.ID, "id": "mine", "url": "https://example.com/x"})
		require.NotNil(t, rerr, m)
		require.Equal(t, "TASK_NOT_FOUND", rerr.Data.Reason, m)
		require.NotContains(t, string(res), "secret")
	}
}

// TestA2APushConfigsSurviveARestart: a task's push notification configs
// are durable: after a restart they are listed again and the webhook gets
// the task's state.
func TestA2APushConfigsSurviveARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startPushStackIn(t, dir, true, "")
	hook, got := webhook(t)
	res, rerr := s.rpc("hold", "SendMessage", map[string]any{"message": message(`{}`),
		"configuration": map[string]any{"returnImmediately": true, "taskPushNotificationConfig": map[string]any{"id": "keep", "url": hook.URL, "token": "t"}}})
	require.Nil(t, rerr)
	sent := taskOf(t, res)
	<-got
	s.stop()

	s = startPushStackIn(t, dir, true, s.key)
	res, rerr = s.rpc("hold", "ListTaskPushNotificationConfigs", map[string]any{"taskId": sent.Task.ID})
	require.Nil(t, rerr)
	require.JSONEq(t, `{"configs":[{"taskId":"`+sent.Task.ID+`","id":"keep","url":"`+hook.URL+`","token":"t"}],"nextPageToken":""}`, string(res))
	select {
	case n := <-got:
		require.Equal(t, "t", n.token)
		require.Contains(t, string(n.body), sent.Task.ID)
	case <-time.After(30 * time.Second):
		t.Fatal("no notification after the restart")
	}
}
