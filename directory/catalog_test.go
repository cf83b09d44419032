package directory

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

const testCatalog = `{"intents":[
  {"id":"conversation.message","description":"talk","payload":{
    "message":{"type":"string","required":true,"maxLength":10},
    "priority":{"type":"string","enum":["low","high"]},
    "count":{"type":"integer"},
    "tags":{"type":"array","maxLength":2}}},
  {"id":"agent.ping"}
]}`

func writeCatalog(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "catalog.json")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestLoadCatalogErrors(t *testing.T) {
	t.Parallel()
	_, err := loadCatalog(filepath.Join(t.TempDir(), "missing.json"))
	require.ErrorIs(t, err, os.ErrNotExist)
	for name, body := range map[string]string{
		"not json":      `{"intents": [`,
		"no intents":    `{}`,
		"missing id":    `{"intents":[{"description":"x"}]}`,
		"duplicate":     `{"intents":[{"id":"a"},{"id":"a"}]}`,
		"unknown key":   `{"intents":[{"id":"a","payload":{"x":{"type":"string","requird":true}}}]}`,
		"unknown type":  `{"intents":[{"id":"a","payload":{"x":{"type":"text"}}}]}`,
		"bad maxLength": `{"intents":[{"id":"a","payload":{"x":{"type":"boolean","maxLength":3}}}]}`,
		"enum type":     `{"intents":[{"id":"a","payload":{"x":{"type":"string","enum":[1]}}}]}`,
		"trailing":      `{"intents":[]} {}`,
	} {
		_, err := loadCatalog(writeCatalog(t, body))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "load intent catalog", name)
	}
	c, err := loadCatalog(writeCatalog(t, testCatalog))
	require.NoError(t, err)
	require.Equal(t, []string{"conversation.message", "agent.ping"}, c.Intents())
}

func TestCatalogValidate(t *testing.T) {
	t.Parallel()
	c, err := ParseCatalog([]byte(testCatalog))
	require.NoError(t, err)
	ok := func(intent, payload string) {
		require.NoError(t, c.Validate(intent, json.RawMessage(payload)), payload)
	}
	bad := func(intent, payload, want string) {
		err := c.Validate(intent, json.RawMessage(payload))
		require.Error(t, err, payload)
		require.Contains(t, err.Error(), want, payload)
	}
	ok("agent.ping", `{"anything":[1,2,3]}`)
	ok("conversation.message", `{"message":"hi","priority":"high","count":3,"tags":["a"],"extra":true}`)
	ok("conversation.message", `{"message":"héllo wörl"}`) // 10 characters, more bytes
	bad("task.delegate", `{}`, "Unknown intent type: task.delegate")
	bad("conversation.message", `{}`, `field "message" is required`)
	bad("conversation.message", `{"message":null}`, `field "message" is required`)
	bad("conversation.message", `{"message":42}`, `field "message" must be of type string, got number`)
	bad("conversation.message", `{"message":"12345678901"}`, `field "message" is 11 characters long, maxLength 10`)
	bad("conversation.message", `{"message":"hi","priority":"urgent"}`, `field "priority" must be one of ["low","high"]`)
	bad("conversation.message", `{"message":"hi","count":1.5}`, `field "count" must be of type integer`)
	bad("conversation.message", `{"message":"hi","tags":[1,2,3]}`, `field "tags" has 3 elements`)
	var open *Catalog
	require.NoError(t, open.Validate("whatever.new", json.RawMessage(`{"x":1}`)))
}

func getCatalog(t *testing.T, b *testBundle) map[string]any {
	t.Helper()
	resp, err := http.Get(b.srv.URL + "/intents/catalog")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(data, &v), string(data))
	return v
}

func TestCatalogInThePipeline(t *testing.T) {
	t.Parallel()
	c, err := ParseCatalog([]byte(testCatalog))
	require.NoError(t, err)
	b := setup(t, func(o *setupOpts) { o.cfg = func(cfg *Config) { cfg.Catalog = c } })
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	v := getCatalog(t, b)
	require.Equal(t, "catalog", v["mode"])
	require.Len(t, v["intents"], 2)

	// Unknown intent: 400, recorded received → failed like a policy denial.
	f := b.frame(alice, bob.id, "task.delegate", `{}`)
	st, body := b.send(f)
	require.Equal(t, http.StatusBadRequest, st)
	code, msg := errBody(t, body)
	require.Equal(t, CodeInvalidIntent, code)
	require.Equal(t, "Unknown intent type: task.delegate", msg)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Failed}, b.states(f.Nonce))
	require.Equal(t, CodeInvalidIntent, b.row(f.Nonce).ErrorCode)

	// A payload breaking a rule, over WebSocket: error frame naming the field.
	ac := b.connect(alice)
	f = b.frame(alice, bob.id, "conversation.message", `{"message":7}`)
	ac.sendIntent(f)
	e := ac.nextOf("error")
	require.Equal(t, CodeInvalidIntent, e.ErrorCode)
	require.Contains(t, e.Message, `field "message"`)
	require.False(t, resultOf(t, ac.nextOf("result").Frame).Success)

	// A valid one goes through.
	f = b.frame(alice, bob.id, "conversation.message", `{"message":"hi"}`)
	ch := b.sendAsync(f)
	require.Equal(t, f.Nonce, intentFrame(t, bc.next()).Nonce)
	bc.respond(b.clock, f.Nonce, true, `{"ok":true}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, ch).status)
}

func TestCatalogOpenMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v := getCatalog(t, b)
	require.Equal(t, "open", v["mode"])
	require.Empty(t, v["intents"])
	alice := b.register("alice")
	st, body := b.send(b.frame(alice, "echo@beam.directory", "made.up.intent", `{"x":1}`))
	require.Equal(t, http.StatusOK, st, string(body))
}
