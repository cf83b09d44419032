package cluster

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/beamtest"
)

// testClusterKey is the directory key of the tests' clusters.
var testClusterKey = ed25519.NewKeyFromSeed([]byte("beam cluster tests directory key"))

// sealNode is a node with a cluster key, enough to seal and verify.
func sealNode(t *testing.T, id string, key ed25519.PrivateKey) *Node {
	t.Helper()
	rej, err := newRejected(nil, func() uint64 { return 0 })
	require.NoError(t, err)
	return &Node{cfg: Config{NodeID: id, Key: key}, lg: beamtest.Logger(t), rejected: rej,
		started: time.Now().Add(-time.Minute)}
}

// A forwarded request's token works only for the node and request it
// names, before it expires, from a holder of the cluster's key, and once;
// a token of another typ (a node entry) does not pass for one.
func TestNodeCallIsBoundToItsNodeAndRequest(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	from := sealNode(t, "n0", key)
	to := sealNode(t, "n1", key)
	body := []byte(`{"id":"m1"}`)
	p := directory.BusPrincipal{Agent: "alice@acme.beam.directory", Via: directory.BusAuthAPIKey}
	good := nodeCall{ID: "0123456789abcdef0123456789abcdef", To: "n1", Method: http.MethodPost, Path: "/v1/beam/ack",
		Query: "", Body: digest(body), Principal: p, Iat: time.Now().Unix(), Exp: time.Now().Add(callTTL).Unix()}
	seq := 0
	seal := func(n *Node, c nodeCall) string {
		seq++
		c.ID = fmt.Sprintf("%s%04d", c.ID, seq) // a new call each time but the replay
		tok, err := n.seal(typNodeCall, c)
		require.NoError(t, err)
		return tok
	}
	tok := seal(from, good)
	_, got, err := to.verifyCall(tok, body, time.Now())
	require.NoError(t, err)
	require.Equal(t, p, got.Principal)
	_, _, err = to.verifyCall(tok, body, time.Now())
	require.ErrorContains(t, err, "replayed", "the same call taken twice")

	mutate := map[string]func(*nodeCall){
		"another node":   func(c *nodeCall) { c.To = "n2" },
		"another path":   func(c *nodeCall) { c.Path = "/v1/beam/send" },
		"another body":   func(c *nodeCall) { c.Body = digest([]byte(`{"id":"m2"}`)) },
		"expired":        func(c *nodeCall) { c.Exp = time.Now().Add(-time.Second).Unix() },
		"far ahead":      func(c *nodeCall) { c.Exp = time.Now().Add(time.Hour).Unix() },
		"before a start": func(c *nodeCall) { c.Iat = time.Now().Add(-2 * time.Minute).Unix() },
		"no ID":          func(c *nodeCall) { c.ID = "" },
		"no principal":   func(c *nodeCall) { c.Principal = directory.BusPrincipal{} },
		"bad principal": func(c *nodeCall) {
			c.Principal = directory.BusPrincipal{Agent: "a@b.beam.directory", Trusted: true, Via: "operator"}
		},
	}
	for name, f := range mutate {
		c := good
		f(&c)
		tok := seal(from, c)
		if name == "no ID" {
			raw, err := from.seal(typNodeCall, c)
			require.NoError(t, err)
			tok = raw
		}
		_, _, err := to.verifyCall(tok, body, time.Now())
		require.Error(t, err, name)
	}
	// Signed by another key, or a node entry offered as a call.
	_, _, err = to.verifyCall(seal(sealNode(t, "n0", other), good), body, time.Now())
	require.ErrorIs(t, err, errUnsealed)
	entry, err := from.seal(typNodeEntry, good)
	require.NoError(t, err)
	_, _, err = to.verifyCall(entry, body, time.Now())
	require.ErrorIs(t, err, errUnsealed)
	// A node does not take its own calls.
	_, _, err = from.verifyCall(seal(from, good), body, time.Now())
	require.Error(t, err)
}

// A forwarded bus or gateway request reaches the answering node's handler
// with the path and query its client sent: an escaped "?" or "#" in a
// segment stays in it (rebuilt from the decoded path, "a%3Fb" became path
// "a" with a query "b"), both nodes route it alike, and a call whose path
// is not an absolute request path is refused.
func TestNodeCallIsServedWithTheClientsPath(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	from, to := sealNode(t, "n0", key), sealNode(t, "n1", key)
	p := directory.BusPrincipal{Agent: "alice@acme.beam.directory", Via: directory.BusAuthAPIKey}
	for _, target := range []string{
		"/v1/beam/messages/a%3Fb",
		"/v1/beam/messages/a%23b?x=%2F",
		"/api/v1/mesh/e%3F1/cancel",
		"/api/v1/mesh/e1/events?after=3",
		"/v1/beam/poll?limit=1",
	} {
		method := http.MethodGet
		if strings.HasSuffix(target, "/cancel") {
			method = http.MethodPost
		}
		req := httptest.NewRequest(method, target, nil)
		_, tok, err := from.newCall(req, "n1", p, req.URL.RawQuery, nil)
		require.NoError(t, err)
		_, c, err := to.verifyCall(tok, nil, time.Now())
		require.NoError(t, err, target)
		require.Equal(t, meshRoute(req.Method, req.URL.Path), c.route(), target)
		r, err := c.request(context.Background(), nil)
		require.NoError(t, err, target)
		require.Equal(t, req.URL.Path, r.URL.Path, target)
		require.Equal(t, req.URL.EscapedPath(), r.URL.EscapedPath(), target)
		require.Equal(t, req.URL.RawQuery, r.URL.RawQuery, target)
		require.Equal(t, req.RequestURI, r.RequestURI, target)
		require.Empty(t, r.URL.Host, target)
	}
	for _, path := range []string{"v1/beam/poll", "//evil/v1/beam/poll", "/v1/beam/messages/%zz"} {
		c := nodeCall{ID: "0123456789abcdef0123456789abcdef", To: "n1", Method: http.MethodGet, Path: path,
			Body: digest(nil), Principal: p, Iat: time.Now().Unix(), Exp: time.Now().Add(callTTL).Unix()}
		tok, err := from.seal(typNodeCall, c)
		require.NoError(t, err)
		_, _, err = to.verifyCall(tok, nil, time.Now())
		require.Error(t, err, path)
	}
}

// The call ledger remembers a call until its token expires, and no more
// than maxCallsRemembered unexpired calls.
func TestCallLedgerIsBounded(t *testing.T) {
	t.Parallel()
	var l callLedger
	now := time.Now()
	require.NoError(t, l.take("a", now.Add(callTTL).Unix(), now))
	require.Error(t, l.take("a", now.Add(callTTL).Unix(), now))
	later := now.Add(3 * callTTL)
	require.NoError(t, l.take("b", later.Add(callTTL).Unix(), later))
	require.Len(t, l.seen, 1, "the expired call is forgotten")
	for i := len(l.seen); i < maxCallsRemembered; i++ {
		require.NoError(t, l.take(fmt.Sprint("c", i), later.Add(callTTL).Unix(), later))
	}
	require.Error(t, l.take("one more", later.Add(callTTL).Unix(), later))
}

// A registry entry applies only at the position after the one it was
// validated at, and only signed by the cluster's key.
func TestRegistryEntryIsBoundToItsPosition(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	n := sealNode(t, "n0", key)
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
