package cluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/httpjson"
)

// homesNode returns a node whose homes bucket lives on js.
func homesNode(t *testing.T, ctx context.Context, js jetstream.JetStream, id string) *Node {
	t.Helper()
	n, kv := bucketNode(t, ctx, js, id, jetstream.KeyValueConfig{Bucket: "BEAM_HOMES_test"})
	n.homes.kv, n.homes.cur = kv, map[string]homeView{}
	return n
}

// TestMoveHomeRefusesAStaleMove: a home moves only from the node it names
// at the revision read; of two takers moving the same home one wins, and a
// move naming a node that is no longer the home changes nothing. An entry
// no member sealed is no home to move.
func TestMoveHomeRefusesAStaleMove(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t)
	a, b, c := homesNode(t, ctx, js, "node-a"), homesNode(t, ctx, js, "node-b"), homesNode(t, ctx, js, "node-c")
	tok, err := a.seal(typHomeEntry, a.homeFor(homeJobs, "node-a"))
	require.NoError(t, err)
	_, err = a.homes.kv.Create(ctx, homeJobs, []byte(tok))
	require.NoError(t, err)

	require.NoError(t, b.moveHome(ctx, homeJobs, "node-a", "node-b"))
	home, ok := b.home(homeJobs)
	require.True(t, ok)
	require.Equal(t, "node-b", home, "the taker knows its move before the watch says so")
	err = c.moveHome(ctx, homeJobs, "node-a", "node-c")
	require.ErrorIs(t, err, errHomeMoved, "a move from a node that is no longer the home")
	e, err := c.homes.kv.Get(ctx, homeJobs)
	require.NoError(t, err)
	h, err := c.homeOf(e)
	require.NoError(t, err)
	require.Equal(t, "node-b", h.Node)
	require.Equal(t, "node-b", h.By)

	// Two moves from the same read: the second's revision is stale.
	rev := e.Revision()
	require.NoError(t, c.moveHome(ctx, homeJobs, "node-b", "node-c"))
	tok, err = b.seal(typHomeEntry, b.homeFor(homeJobs, "node-b"))
	require.NoError(t, err)
	_, err = b.homes.kv.Update(ctx, homeJobs, []byte(tok), rev)
	require.Error(t, err, "an update at a stale revision")

	// An entry signed by another key is not a home.
	_, err = a.homes.kv.Put(ctx, homeJobs, []byte(strings.Repeat("x", 10)))
	require.NoError(t, err)
	require.ErrorIs(t, a.moveHome(ctx, homeJobs, "node-c", "node-a"), errUnsealed)
}

// jobsMsg is a jobs call from n to node for req, as forwardJobs sends it.
func jobsMsg(t *testing.T, n *Node, node string, req *http.Request, body []byte) (*nats.Msg, jobsCall) {
	t.Helper()
	hdrs, err := forwardedHeaders(req)
	require.NoError(t, err)
	now := time.Now()
	c := jobsCall{ID: "0123456789abcdef0123", To: node, Method: req.Method, Path: req.URL.EscapedPath(), Query: req.URL.RawQuery,
		Body: digest(body), Headers: digest(hdrs), Iat: now.Unix(), Exp: now.Add(jobsTimeout).Unix()}
	tok, err := n.seal(typJobsCall, c)
	require.NoError(t, err)
	return &nats.Msg{Data: body, Header: nats.Header{headerSeal: {tok}, headerJobsHeaders: {string(hdrs)}}}, c
}

// TestJobsCallIsBoundToItsNodeBodyAndHeaders: a jobs call passes only at
// the node it names, with the body and the headers it was sealed over,
// once; the headers the home serves it with are the job bus's only.
func TestJobsCallIsBoundToItsNodeBodyAndHeaders(t *testing.T) {
	t.Parallel()
	from, home, other := sealNode(t, "node-a", testClusterKey), sealNode(t, "node-b", testClusterKey), sealNode(t, "node-c", testClusterKey)
	req := httptest.NewRequest(http.MethodPost, "/claim?namespace=q", nil)
	req.Header.Set("X-Api-Key", "key-1")
	req.Header.Set("X-Beam-Other", "dropped")
	body := []byte(`{}`)

	m, _ := jobsMsg(t, from, "node-b", req, body)
	_, _, _, err := other.verifyJobsCall(m, time.Now())
	require.Error(t, err, "a call for another node")

	tampered := &nats.Msg{Data: []byte(`{"x":1}`), Header: m.Header}
	_, _, _, err = home.verifyJobsCall(tampered, time.Now())
	require.Error(t, err, "another body")

	swapped := &nats.Msg{Data: body, Header: nats.Header{headerSeal: m.Header[headerSeal],
		headerJobsHeaders: {`{"X-Api-Key":["stolen-key"]}`}}}
	_, _, _, err = home.verifyJobsCall(swapped, time.Now())
	require.Error(t, err, "other headers")

	got, c, hdr, err := home.verifyJobsCall(m, time.Now())
	require.NoError(t, err)
	require.Equal(t, "node-a", got)
	require.Equal(t, "/claim", c.Path)
	require.Equal(t, "key-1", hdr.Get("X-Api-Key"))
	require.Empty(t, hdr.Get("X-Beam-Other"), "a header the job bus does not read")

	_, _, _, err = home.verifyJobsCall(m, time.Now())
	require.Error(t, err, "a replay")

	// A bus call's token does not pass for a jobs call.
	busTok, err := from.seal(typNodeCall, c)
	require.NoError(t, err)
	m2, _ := jobsMsg(t, from, "node-b", req, body)
	m2.Header.Set(headerSeal, busTok)
	_, _, _, err = home.verifyJobsCall(m2, time.Now())
	require.Error(t, err, "a token of another typ")
}

// TestJobsHandlerWhileTheHomeIsDown: while the home's entry is gone from
// the nodes bucket (or no node is home yet) a node answers the job bus's
// requests 503 with Retry-After, in the shape it is given, and never
// serves them itself; the home serves them itself; a request claiming to
// be a node call is refused 401.
func TestJobsHandlerWhileTheHomeIsDown(t *testing.T) {
	t.Parallel()
	n := sealNode(t, "node-a", testClusterKey)
	n.homes.cur = map[string]homeView{}
	served := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { served++; w.WriteHeader(http.StatusNoContent) })
	problem := func(w http.ResponseWriter, e *httpjson.Error) {
		e.SetRetryAfter(w.Header())
		httpjson.Write(w, e.Status, map[string]any{"error": map[string]any{"code": e.Code, "message": e.Message}})
	}
	h := n.JobsHandler(next, problem)
	do := func(hdr ...string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/claim", strings.NewReader(`{}`))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		h.ServeHTTP(rec, req)
		return rec
	}

	rec := do()
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, "no home yet")
	require.Equal(t, "5", rec.Header().Get("Retry-After"))
	require.JSONEq(t, `{"error":{"code":"home_unavailable","message":"The node serving the job bus is unavailable; retry."}}`, rec.Body.String())

	n.homes.cur[homeJobs] = homeView{homeEntry: homeEntry{Name: homeJobs, Node: "node-b"}}
	n.route.live = map[string]bool{"node-a": true}
	rec = do()
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, "the home's entry is gone")
	require.Equal(t, "5", rec.Header().Get("Retry-After"))
	require.Zero(t, served)

	n.homes.cur[homeJobs] = homeView{homeEntry: homeEntry{Name: homeJobs, Node: "node-a"}}
	require.Equal(t, http.StatusNoContent, do().Code)
	require.Equal(t, 1, served)
	require.Equal(t, http.StatusUnauthorized, do(headerCall, "x").Code)
	require.Equal(t, 1, served)
}

// TestJobsHandlerReadsAMovedHome: a node whose watch has not yet told it
// that a takeover moved the job bus's home (its view still names the dead
// node) reads the bucket itself when a request finds the home down, and
// serves the request, here as the new home, instead of answering 503
// until the watch catches up.
func TestJobsHandlerReadsAMovedHome(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t)
	a, b := homesNode(t, ctx, js, "node-a"), homesNode(t, ctx, js, "node-b")
	tok, err := b.seal(typHomeEntry, b.homeFor(homeJobs, "node-b"))
	require.NoError(t, err)
	_, err = b.homes.kv.Create(ctx, homeJobs, []byte(tok))
	require.NoError(t, err)
	e, err := a.homes.kv.Get(ctx, homeJobs)
	require.NoError(t, err)
	a.noteHome(e)
	// node-b dies; node-a takes its log over and its home with it, while
	// the other's view (here, a's own watch is not running) lags.
	require.NoError(t, a.moveHome(ctx, homeJobs, "node-b", "node-a"))
	a.homes.cur[homeJobs] = homeView{homeEntry: homeEntry{Name: homeJobs, Node: "node-b"}, rev: e.Revision()}
	a.route.live = map[string]bool{"node-a": true}

	served := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { served++; w.WriteHeader(http.StatusNoContent) })
	h := a.JobsHandler(next, func(w http.ResponseWriter, e *httpjson.Error) { httpjson.Write(w, e.Status, e.Message) })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/claim", strings.NewReader(`{}`)))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Equal(t, 1, served)
}

// TestJobsCallIsServedWithTheClientsPath: the home serves a forwarded
// request with the path and query the client sent, as its own listener
// would read them; a path beginning "//" stays a path (a route the job bus
// does not have), not a host and another route, so a node that is not the
// home answers it as the home does.
func TestJobsCallIsServedWithTheClientsPath(t *testing.T) {
	t.Parallel()
	from := sealNode(t, "node-a", testClusterKey)
	for _, target := range []string{"//evil/intent", "/status/a%2Fb?namespace=q&x=%2F", "/claim?goal=resize"} {
		home := sealNode(t, "node-b", testClusterKey) // each call's ID is taken once
		req := httptest.NewRequest(http.MethodPost, target, nil)
		req.RemoteAddr = "192.0.2.1:1234"
		m, _ := jobsMsg(t, from, "node-b", req, []byte(`{}`))
		_, c, hdr, err := home.verifyJobsCall(m, time.Now())
		require.NoError(t, err)
		c.Remote = req.RemoteAddr
		r, err := c.request(context.Background(), m.Data, hdr)
		require.NoError(t, err, target)
		require.Equal(t, req.URL.Path, r.URL.Path, target)
		require.Equal(t, req.URL.EscapedPath(), r.URL.EscapedPath(), target)
		require.Equal(t, req.URL.RawQuery, r.URL.RawQuery, target)
		require.Empty(t, r.URL.Host, target)
		require.Equal(t, req.RequestURI, r.RequestURI, target)
		require.Equal(t, "192.0.2.1:1234", r.RemoteAddr)
	}
}
