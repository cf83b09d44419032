package cluster

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory"
)

// testClusterKey is the directory key of the tests' clusters.
var testClusterKey = ed25519.NewKeyFromSeed([]byte("beam cluster tests directory key"))

// sealNode is a node with a cluster key and an announced URL, enough to
// seal and verify.
func sealNode(t *testing.T, id string, key ed25519.PrivateKey, url string) *Node {
	t.Helper()
	rej, err := newRejected(nil, func() uint64 { return 0 })
	require.NoError(t, err)
	n := &Node{cfg: Config{NodeID: id, Key: key}, lg: slog.New(slog.NewTextHandler(io.Discard, nil)), rejected: rej}
	n.members.url = url
	return n
}

// A forwarded request's token works only for the node, URL and request it
// names, before it expires, from a holder of the cluster's key; a token
// of another typ (a node entry) does not pass for one.
func TestNodeCallIsBoundToItsNodeAndRequest(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	from := sealNode(t, "n0", key, "http://127.0.0.1:1")
	to := sealNode(t, "n1", key, "http://127.0.0.1:2")
	p := directory.BusPrincipal{Agent: "alice@acme.beam.directory", Via: directory.BusAuthAPIKey}
	good := nodeCall{To: "n1", URL: "http://127.0.0.1:2", Method: http.MethodPost, Path: "/v1/beam/ack",
		Query: "", Body: digest([]byte(`{"id":"m1"}`)), Principal: p, Exp: time.Now().Add(callTTL).Unix()}
	request := func(tok string, body string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/beam/ack", strings.NewReader(body))
		r.Header.Set(headerCall, tok)
		return r
	}
	seal := func(n *Node, c nodeCall) string {
		tok, err := n.seal(typNodeCall, c)
		require.NoError(t, err)
		return tok
	}
	tok := seal(from, good)
	got, err := to.verifyCall(request(tok, `{"id":"m1"}`), []byte(`{"id":"m1"}`))
	require.NoError(t, err)
	require.Equal(t, p, got)

	mutate := map[string]func(*nodeCall){
		"another node": func(c *nodeCall) { c.To = "n2" },
		"another URL":  func(c *nodeCall) { c.URL = "http://127.0.0.1:3" },
		"another path": func(c *nodeCall) { c.Path = "/v1/beam/lease" },
		"another body": func(c *nodeCall) { c.Body = digest([]byte(`{"id":"m2"}`)) },
		"expired":      func(c *nodeCall) { c.Exp = time.Now().Add(-time.Second).Unix() },
		"far ahead":    func(c *nodeCall) { c.Exp = time.Now().Add(time.Hour).Unix() },
		"no principal": func(c *nodeCall) { c.Principal = directory.BusPrincipal{} },
		"bad principal": func(c *nodeCall) {
			c.Principal = directory.BusPrincipal{Agent: "a@b.beam.directory", Trusted: true, Via: "operator"}
		},
	}
	for name, f := range mutate {
		c := good
		f(&c)
		_, err := to.verifyCall(request(seal(from, c), `{"id":"m1"}`), []byte(`{"id":"m1"}`))
		require.Error(t, err, name)
	}
	// Signed by another key, or a node entry offered as a call.
	_, err = to.verifyCall(request(seal(sealNode(t, "n0", other, ""), good), `{"id":"m1"}`), []byte(`{"id":"m1"}`))
	require.ErrorIs(t, err, errUnsealed)
	entry, err := from.seal(typNodeEntry, good)
	require.NoError(t, err)
	_, err = to.verifyCall(request(entry, `{"id":"m1"}`), []byte(`{"id":"m1"}`))
	require.ErrorIs(t, err, errUnsealed)
	// A node does not take its own calls.
	_, err = from.verifyCall(request(tok, `{"id":"m1"}`), []byte(`{"id":"m1"}`))
	require.Error(t, err)
}

// A registry entry applies only at the position after the one it was
// validated at, and only signed by the cluster's key.
func TestRegistryEntryIsBoundToItsPosition(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	n := sealNode(t, "n0", key, "")
	tok, err := n.seal(typRegistryEntry, registryEntry{After: 6, Op: json.RawMessage(`{"kind":"agent.delete"}`)})
	require.NoError(t, err)
	op, err := n.openEntry(7, []byte(tok))
	require.NoError(t, err)
	require.JSONEq(t, `{"kind":"agent.delete"}`, string(op))
	_, err = n.openEntry(9, []byte(tok))
	require.Error(t, err, "a copy published again")
	_, err = n.openEntry(7, []byte(`{"after":6,"op":{"kind":"agent.delete"}}`))
	require.ErrorIs(t, err, errUnsealed)
}
