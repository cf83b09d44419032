package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
)

const a2aOperatorToken = "a2a-operator-token-0123456789"

func a2aID(name string) string { return name + "@a2a.beam.directory" }

// a2aStack is a real beam serve declaring the pipelines "enrich" (three
// Go SDK actors enriching the payload, the second also streaming a FLY
// event) and "hold" (an actor that never answers), with two calling
// agents.
type a2aStack struct {
	p             *beamtest.Process
	ctx           context.Context
	caller, other *agents.Identity
	greeter       *agents.Identity // opted in to A2A, skill greeting.hello
}

// extra holds BEAM_* variables for its environment and --flags for its
// command line.
func startA2AStack(t *testing.T, extra ...string) *a2aStack {
	t.Helper()
	dir := t.TempDir()
	decl := map[string]any{"pipelines": []map[string]any{
		{"name": "enrich", "description": "Enriches a product with a name, a recipe and a verdict",
			"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"product_id": map[string]any{"type": "string"}},
				"required": []string{"product_id"}},
			"route": []string{a2aID("loader"), a2aID("recipe"), a2aID("judge")}},
		{"name": "hold", "description": "Waits for ever", "route": []string{a2aID("hold")}},
	}}
	raw, err := json.Marshal(decl)
	require.NoError(t, err)
	path := filepath.Join(dir, "pipelines.json")
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	catalog := filepath.Join(dir, "catalog.json")
	require.NoError(t, os.WriteFile(catalog, []byte(`{"intents":[
		{"id":"greeting.hello","description":"Greets someone","payload":{"name":{"type":"string","required":true,"maxLength":100}}},
		{"id":"mesh.envelope","description":"A pipeline hop"}]}`), 0o600))
	args := []string{"--pipelines", path, "--open-orgs", "--intent-catalog", catalog}
	env := []string{"BEAM_ADMIN_TOKEN=" + a2aOperatorToken}
	for _, x := range extra {
		if strings.HasPrefix(x, "--") {
			args = append(args, x)
		} else {
			env = append(env, x)
		}
	}
	p := beamtest.Start(t, beamtest.Options{Args: args, Env: env})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	s := &a2aStack{p: p, ctx: ctx}
	s.caller, _ = sdkAgent(t, ctx, p.URL(), a2aID("client"))
	s.other, _ = sdkAgent(t, ctx, p.URL(), a2aID("other"))
	handlers := map[string]agents.MeshHandler{
		"loader": enrich(func(m map[string]any) { m["product_name"] = "Ice-cream Bourgignon" }),
		"recipe": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			if err := h.Fly(ctx, map[string]any{"token": "cooking"}); err != nil {
				return nil, err
			}
			return enrichPayload(h, func(m map[string]any) { m["recipe"] = "Cook ice-cream in tomato sauce for 3 hours" })
		},
		"judge": enrich(func(m map[string]any) {
			m["recipe_eval"] = "INVALID"
			m["recipe_eval_details"] = "Recipe is nonsense"
		}),
		"hold": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}
	for name, h := range handlers {
		ident, _ := sdkAgent(t, ctx, p.URL(), a2aID(name))
		c := sdkClient(t, p.URL(), ident)
		c.HandleMesh(h)
		require.NoError(t, c.Connect(ctx))
	}
	// An agent that opts in to A2A: its other capability is its skill.
	greeter, err := agents.GenerateIdentity(a2aID("greeter"))
	require.NoError(t, err)
	c := sdkClient(t, p.URL(), greeter)
	res, err := c.Register(ctx, greeter.BeamID, []string{"a2a", "greeting.hello"})
	require.NoError(t, err)
	greeter.APIKey = res.APIKey
	s.greeter = greeter
	c = sdkClient(t, p.URL(), greeter)
	c.Handle("greeting.hello", func(_ context.Context, in *agents.Intent) agents.Reply {
		var m struct {
			Name string `json:"name"`
		}
		if err := in.Bind(&m); err != nil {
			return agents.Failure("BAD_REQUEST", err.Error())
		}
		return agents.Success(map[string]string{"greeting": "hello " + m.Name, "from": in.From})
	})
	require.NoError(t, c.Connect(ctx))
	return s
}

// jsFixture returns node and fixtures/a2a-js, skipping when either is
// missing.
func jsFixture(t *testing.T, module string) (string, string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH; the A2A and MCP client tests need Node.js 20+")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "fixtures", "a2a-js"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", module)); err != nil {
		t.Skipf("%s/node_modules is missing; run `npm ci` there first", dir)
	}
	return node, dir
}

// TestA2AClientFromNPM drives the declared pipelines with the published
// @a2a-js/sdk (fixtures/a2a-js/a2a.mjs): card resolution, a streamed send
// through three Go SDK actors to completed with the enriched payload as
// artifact, get, list, cancel mid-flight, subscribe, the HTTP+JSON
// binding, isolation between agents, an opted-in agent, and the 0.3
// JSON-RPC methods.
func TestA2AClientFromNPM(t *testing.T) {
	t.Parallel()
	node, dir := jsFixture(t, "@a2a-js/sdk")
	s := startA2AStack(t)
	beamtest.NodeChecks(t, s.ctx, node, dir, "a2a.mjs",
		"BEAM_URL="+s.p.URL(), "BEAM_KEY="+s.caller.APIKey, "BEAM_OTHER_KEY="+s.other.APIKey,
		"BEAM_AGENT="+s.greeter.BeamID, "BEAM_CALLER="+s.caller.BeamID)
}

// TestServeRefusesABadPipelinesFile: a malformed declaration stops beam
// serve before it listens, naming the pipeline and the fault.
func TestServeRefusesABadPipelinesFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "pipelines.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"pipelines":[{"name":"enrich","route":["prep@example.com"]}]}`), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := beamtest.Run(t, ctx, "serve", "--pipelines", path, "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--intent-listen", "")
	require.Error(t, err)
	require.Contains(t, out, `pipeline "enrich": route actor "prep@example.com" is not a Beam ID`)
}

// a2aCall makes an A2A request and returns the status, the headers and
// the body.
func httpCall(t *testing.T, ctx context.Context, method, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

// TestA2AAttacks: calls without credentials (or with a wrong key, or the
// operator token naming no agent) get 401 with the card's bearer scheme;
// an agent can neither read, list, follow nor cancel another agent's task.
func TestA2AAttacks(t *testing.T) {
	t.Parallel()
	s := startA2AStack(t)
	base := s.p.URL()
	send := `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"data":{"n":1}}]},"configuration":{"returnImmediately":true}}}`

	for name, hdr := range map[string][]string{
		"no credentials":         nil,
		"a wrong key":            {"Authorization", "Bearer bk_forged"},
		"operator without agent": {"Authorization", "Bearer " + a2aOperatorToken},
	} {
		for _, u := range []string{base + "/a2a/pipelines/hold", base + "/a2a/pipelines/hold/message:send"} {
			status, h, body := httpCall(t, s.ctx, http.MethodPost, u, send, hdr...)
			require.Equal(t, http.StatusUnauthorized, status, "%s: %s", name, body)
			require.Contains(t, h.Get("WWW-Authenticate"), "Bearer", name)
			require.Contains(t, string(body), `"errorCode":"UNAUTHORIZED"`, name)
		}
	}
	var card struct {
		SecuritySchemes map[string]map[string]any `json:"securitySchemes"`
	}
	_, _, body := httpCall(t, s.ctx, http.MethodGet, base+"/a2a/pipelines/hold/.well-known/agent-card.json", "")
	require.NoError(t, json.Unmarshal(body, &card))
	require.Equal(t, "bearer", card.SecuritySchemes["bearer"]["scheme"], "the 401 names the scheme the card gives")

	// A payload that does not match the pipeline's input schema is refused.
	_, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/a2a/pipelines/enrich",
		`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m0","role":"ROLE_USER","parts":[{"data":{"product_id":5}}]}}}`,
		"Authorization", "Bearer "+s.caller.APIKey)
	require.Contains(t, string(body), `"code":-32602`, string(body))
	require.Contains(t, string(body), "input schema of enrich", string(body))

	// The caller's task, mid-flight.
	status, _, body := httpCall(t, s.ctx, http.MethodPost, base+"/a2a/pipelines/hold", send, "Authorization", "Bearer "+s.caller.APIKey)
	require.Equal(t, http.StatusOK, status, string(body))
	var res struct {
		Result struct {
			Task struct {
				ID string `json:"id"`
			} `json:"task"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(body, &res))
	id := res.Result.Task.ID
	require.NotEmpty(t, id, string(body))

	other := []string{"Authorization", "Bearer " + s.other.APIKey}
	for _, m := range []string{"GetTask", "CancelTask", "SubscribeToTask", "tasks/get", "tasks/cancel", "tasks/resubscribe"} {
		_, _, body := httpCall(t, s.ctx, http.MethodPost, base+"/a2a/pipelines/hold",
			`{"jsonrpc":"2.0","id":2,"method":"`+m+`","params":{"id":"`+id+`"}}`, other...)
		require.Contains(t, string(body), `"code":-32001`, "%s by another agent: %s", m, body)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/a2a/pipelines/hold/tasks/" + id},
		{http.MethodPost, "/a2a/pipelines/hold/tasks/" + id + ":cancel"},
		{http.MethodPost, "/a2a/tasks/" + id + ":cancel"},
		{http.MethodGet, "/a2a/tasks/" + id},
		{http.MethodGet, "/a2a/pipelines/hold/tasks/" + id + ":subscribe"},
	} {
		status, _, body := httpCall(t, s.ctx, c.method, base+c.path, "", other...)
		require.Equal(t, http.StatusNotFound, status, "%s %s by another agent: %s", c.method, c.path, body)
	}
	// The operator acting for the other agent sees nothing either.
	status, _, body = httpCall(t, s.ctx, http.MethodGet, base+"/a2a/tasks/"+id, "",
		"Authorization", "Bearer "+a2aOperatorToken, "X-Beam-Id", s.other.BeamID)
	require.Equal(t, http.StatusNotFound, status, string(body))
	_, _, body = httpCall(t, s.ctx, http.MethodGet, base+"/a2a/tasks", "", other...)
	require.JSONEq(t, `{"tasks":[],"nextPageToken":"","pageSize":0,"totalSize":0}`, string(body))
	// The task is still running: nothing the other agent did reached it.
	require.Eventually(t, func() bool {
		status, _, body := httpCall(t, s.ctx, http.MethodGet, base+"/a2a/tasks/"+id, "", "Authorization", "Bearer "+s.caller.APIKey)
		return status == http.StatusOK && strings.Contains(string(body), `"TASK_STATE_WORKING"`)
	}, 10*time.Second, 20*time.Millisecond)
	// An opted-in agent's policy applies to A2A messages as to any send:
	// once the greeter denies the other agent, its message is refused, and
	// the caller's intents are not the other agent's to read.
	greet := `{"jsonrpc":"2.0","id":3,"method":"SendMessage","params":{"message":{"messageId":"g1","role":"ROLE_USER","parts":[{"data":{"name":"Eve"}}]}}}`
	agentURL := base + "/a2a/agents/" + s.greeter.BeamID
	_, _, body = httpCall(t, s.ctx, http.MethodPost, agentURL, greet, "Authorization", "Bearer "+s.caller.APIKey)
	require.Contains(t, string(body), `"TASK_STATE_COMPLETED"`, string(body))
	require.NoError(t, json.Unmarshal(body, &res))
	intentTask := res.Result.Task.ID
	status, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/acl",
		`{"targetBeamId":"`+s.greeter.BeamID+`","intentType":"*","allowedFrom":"`+s.other.BeamID+`","effect":"deny"}`,
		"X-Api-Key", s.greeter.APIKey)
	require.Less(t, status, 300, string(body))
	_, _, body = httpCall(t, s.ctx, http.MethodPost, agentURL, greet, other...)
	require.Contains(t, string(body), "ACL denied", "a denied sender's A2A message went through: %s", body)
	require.NotContains(t, string(body), "hello Eve")
	_, _, body = httpCall(t, s.ctx, http.MethodPost, agentURL, `{"jsonrpc":"2.0","id":4,"method":"GetTask","params":{"id":"`+intentTask+`"}}`, other...)
	require.Contains(t, string(body), `"code":-32001`, "another agent read the caller's intent: %s", body)

	// A pipeline whose first actor refuses the other agent refuses it
	// through A2A, before any envelope exists.
	status, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/acl",
		`{"targetBeamId":"`+a2aID("loader")+`","intentType":"*","allowedFrom":"`+s.other.BeamID+`","effect":"deny"}`,
		"Authorization", "Bearer "+a2aOperatorToken)
	require.Less(t, status, 300, string(body))
	enrichSend := `{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"messageId":"e1","role":"ROLE_USER","parts":[{"data":{"product_id":"1"}}]}}}`
	_, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/a2a/pipelines/enrich", enrichSend, other...)
	require.Contains(t, string(body), "ACL denied", "a sender the first actor denies started a task: %s", body)
	status, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/a2a/pipelines/enrich/message:send", enrichSend[strings.Index(enrichSend, `{"message"`):len(enrichSend)-1], other...)
	require.Equal(t, http.StatusForbidden, status, string(body))
	_, _, body = httpCall(t, s.ctx, http.MethodGet, base+"/api/v1/mesh", "", "X-Api-Key", s.other.APIKey)
	require.Contains(t, string(body), `"total":0`, "the refused sends created envelopes: %s", body)

	// The caller finds its own task through the directory's endpoint.
	_, _, body = httpCall(t, s.ctx, http.MethodGet, base+"/a2a/tasks", "", "Authorization", "Bearer "+s.caller.APIKey)
	require.Contains(t, string(body), `"id":"`+id+`"`, string(body))
	_, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/a2a", `{"jsonrpc":"2.0","id":5,"method":"GetTask","params":{"id":"`+id+`"}}`,
		"Authorization", "Bearer "+s.caller.APIKey)
	require.Contains(t, string(body), `"id":"`+id+`"`, string(body))
	// A version the server does not speak is refused as the specification says.
	_, _, body = httpCall(t, s.ctx, http.MethodPost, base+"/a2a", `{"jsonrpc":"2.0","id":6,"method":"GetTask","params":{"id":"`+id+`"}}`,
		"Authorization", "Bearer "+s.caller.APIKey, "A2A-Version", "2.0")
	require.Contains(t, string(body), `"code":-32009`, string(body))

	// The task is the envelope: its creator, protocol and pipeline are on it.
	status, _, body = httpCall(t, s.ctx, http.MethodGet, base+"/api/v1/mesh/"+id, "", "X-Api-Key", s.caller.APIKey)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Contains(t, string(body), `"x-beam-protocol":"a2a"`)
	require.Contains(t, string(body), `"x-beam-pipeline":"hold"`)
}

// TestMCPClientFromNPM drives the declared pipelines as MCP tools with the
// published @modelcontextprotocol/sdk (fixtures/a2a-js/mcp.mjs): the tools
// with their schemas, a call with progress notifications to its
// structured result, a call off the schema, a cancelled call that cancels
// its envelope, and the tool of an opted-in agent's intent, which refuses
// a caller the agent's policy refuses.
func TestMCPClientFromNPM(t *testing.T) {
	t.Parallel()
	node, dir := jsFixture(t, "@modelcontextprotocol/sdk")
	s := startA2AStack(t)
	// The greeter and the pipeline's first actor refuse the other agent:
	// its MCP calls must be refused too.
	for _, target := range []string{s.greeter.BeamID, a2aID("loader")} {
		status, _, body := httpCall(t, s.ctx, http.MethodPost, s.p.URL()+"/acl",
			`{"targetBeamId":"`+target+`","intentType":"*","allowedFrom":"`+s.other.BeamID+`","effect":"deny"}`,
			"Authorization", "Bearer "+a2aOperatorToken)
		require.Less(t, status, 300, string(body))
	}
	beamtest.NodeChecks(t, s.ctx, node, dir, "mcp.mjs", "BEAM_URL="+s.p.URL(), "BEAM_KEY="+s.caller.APIKey, "BEAM_CALLER="+s.caller.BeamID,
		"BEAM_OTHER_KEY="+s.other.APIKey)
}

// TestMCPAttacks: calls without credentials get 401 with the bearer
// scheme; another agent cannot use a session an agent opened, so it sees
// none of its calls (their progress and results travel on that session).
func TestMCPAttacks(t *testing.T) {
	t.Parallel()
	s := startA2AStack(t)
	u := s.p.URL() + "/mcp"
	accept := []string{"Accept", "application/json, text/event-stream"}
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	for name, hdr := range map[string][]string{
		"no credentials":         accept,
		"a wrong key":            append([]string{"Authorization", "Bearer bk_forged"}, accept...),
		"operator without agent": append([]string{"Authorization", "Bearer " + a2aOperatorToken}, accept...),
	} {
		status, h, body := httpCall(t, s.ctx, http.MethodPost, u, initialize, hdr...)
		require.Equal(t, http.StatusUnauthorized, status, "%s: %s", name, body)
		require.Contains(t, h.Get("WWW-Authenticate"), "Bearer", name)
	}
	status, h, body := httpCall(t, s.ctx, http.MethodPost, u, initialize,
		append([]string{"Authorization", "Bearer " + s.caller.APIKey}, accept...)...)
	require.Equal(t, http.StatusOK, status, string(body))
	session := h.Get("Mcp-Session-Id")
	require.NotEmpty(t, session)
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	status, _, body = httpCall(t, s.ctx, http.MethodPost, u, list,
		append([]string{"Authorization", "Bearer " + s.other.APIKey, "Mcp-Session-Id", session}, accept...)...)
	require.Equal(t, http.StatusForbidden, status, "another agent used the caller's session: %s", body)
	status, _, body = httpCall(t, s.ctx, http.MethodGet, u, "",
		append([]string{"Authorization", "Bearer " + s.other.APIKey, "Mcp-Session-Id", session}, accept...)...)
	require.Equal(t, http.StatusForbidden, status, "another agent followed the caller's session: %s", body)
}

// TestA2AFloodIsRateLimited: tasks count against the caller's intent rate
// limit; past it, both bindings refuse and no envelope is created.
func TestA2AFloodIsRateLimited(t *testing.T) {
	t.Parallel()
	s := startA2AStack(t, "BEAM_LIMIT_INTENTS=3/1h")
	s.sendsBeyondALimit(t, "enrich", `{"product_id":"1"}`, 3, "RATE_LIMITED")
}

// TestA2AOpenEnvelopeCap: tasks are envelopes of their caller, so the
// gateway's cap of open envelopes per creator holds through A2A (JSON-RPC
// and HTTP+JSON): past it, no envelope is made.
func TestA2AOpenEnvelopeCap(t *testing.T) {
	t.Parallel()
	s := startA2AStack(t, "--limit-mesh-open=2")
	s.sendsBeyondALimit(t, "hold", `{"n":1}`, 2, "TOO_MANY_OPEN_ENVELOPES")
}

// sendsBeyondALimit sends n non-blocking tasks with data to pipeline, which
// are accepted, then one over JSON-RPC (error -32000 with reason) and one
// over HTTP+JSON (429), which are refused without an envelope.
func (s *a2aStack) sendsBeyondALimit(t *testing.T, pipeline, data string, n int, reason string) {
	t.Helper()
	msg := `{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"data":` + data + `}]},"configuration":{"returnImmediately":true}}`
	send := `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":` + msg + `}`
	auth := []string{"Authorization", "Bearer " + s.caller.APIKey}
	url := s.p.URL() + "/a2a/pipelines/" + pipeline
	for range n {
		_, _, body := httpCall(t, s.ctx, http.MethodPost, url, send, auth...)
		require.Contains(t, string(body), `"result"`, string(body))
	}
	_, _, body := httpCall(t, s.ctx, http.MethodPost, url, send, auth...)
	require.Contains(t, string(body), `"code":-32000`, string(body))
	require.Contains(t, string(body), reason, string(body))
	status, _, body := httpCall(t, s.ctx, http.MethodPost, url+"/message:send", msg, auth...)
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	status, _, body = httpCall(t, s.ctx, http.MethodGet, s.p.URL()+"/api/v1/mesh", "", "X-Api-Key", s.caller.APIKey)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, string(body), fmt.Sprintf(`"total":%d`, n), "the refused sends created envelopes: %s", body)
}

// TestA2AStreamOutlivesTheWriteTimeout: a task's stream lasts as long as
// the task, not as long as the server's write timeout allows a response.
func TestA2AStreamOutlivesTheWriteTimeout(t *testing.T) {
	t.Parallel()
	s := startA2AStack(t, "--write-timeout=1s")
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, s.p.URL()+"/a2a/pipelines/hold",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"data":{"n":1}}]}}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.caller.APIKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	next := func() string {
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				return d
			}
		}
		return ""
	}
	first := next()
	var ev struct {
		Result struct {
			Task struct {
				ID string `json:"id"`
			} `json:"task"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(first), &ev), first)
	// The condition is the passing of the write timeout itself.
	<-time.After(1500 * time.Millisecond)
	status, _, body := httpCall(t, s.ctx, http.MethodPost, s.p.URL()+"/a2a/tasks/"+ev.Result.Task.ID+":cancel", "", "Authorization", "Bearer "+s.caller.APIKey)
	require.Equal(t, http.StatusOK, status, string(body))
	var last string
	for d := next(); d != ""; d = next() {
		last = d
	}
	require.Contains(t, last, `"TASK_STATE_CANCELED"`, "the stream was cut before the task ended")
}
