package cluster

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory"
)

// natsURL starts a NATS server on a random loopback port.
func natsURL(t *testing.T) string {
	t.Helper()
	s, _ := jetStreamServer(t)
	return s.ClientURL()
}

// streamNode is a node of the tests' cluster connected to url.
func streamNode(t *testing.T, url, id string, key ed25519.PrivateKey) *Node {
	t.Helper()
	n := sealNode(t, id, key)
	n.cfg.Domain = "stream.beam.directory"
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	n.nc = nc
	return n
}

// TestStreamChunkNotSealedByTheAnsweringNodeIsDropped: attack: a NATS
// client that can publish to the caller's inbox slips chunks into a
// forwarded stream — sealed by another key, sealed by the cluster's key
// as another node, for another call, out of place, or with altered bytes.
// The caller drops each one and takes only the answering node's chunk.
func TestStreamChunkNotSealedByTheAnsweringNodeIsDropped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := natsURL(t)
	caller := streamNode(t, url, "caller", testClusterKey)
	answerer := streamNode(t, url, "answerer", testClusterKey)
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	impostor := streamNode(t, url, "answerer", otherKey)
	member := streamNode(t, url, "member", testClusterKey)

	inbox := caller.nc.NewRespInbox()
	sub, err := caller.nc.SubscribeSync(inbox)
	require.NoError(t, err)
	// The chunks come from other connections: the server must know the
	// subscription before they are published, or it drops them.
	require.NoError(t, caller.nc.Flush())
	publish := func(by *Node, s streamSeal, data string) {
		tok, err := by.seal(typStreamChunk, s)
		require.NoError(t, err)
		require.NoError(t, by.nc.PublishMsg(&nats.Msg{Subject: inbox, Data: []byte(data),
			Header: nats.Header{headerSeal: {tok}, headerStream: {strconv.Itoa(s.I)}}}))
	}
	bad := "data: forged\n\n"
	good := streamSeal{Call: "call-1", To: "caller", I: 1, Body: digest([]byte(bad)), Status: http.StatusOK}
	publish(impostor, good, bad) // another key
	publish(member, good, bad)   // another node's chunk
	other := good
	other.Call = "call-2"
	publish(answerer, other, bad) // another call
	later := good
	later.I = 2
	publish(answerer, later, bad)                             // out of place
	publish(answerer, good, bad+"x")                          // altered bytes
	require.NoError(t, caller.nc.Publish(inbox, []byte(bad))) // no seal at all

	sw := &streamWriter{n: answerer, reply: inbox, call: "call-1", to: "caller", header: http.Header{}}
	sw.Header().Set("Content-Type", "text/event-stream")
	_, err = sw.Write([]byte("data: real\n\n"))
	require.NoError(t, err)
	sw.Flush()

	s, data, err := caller.nextChunk(ctx, sub, "answerer", "call-1", 1, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "data: real\n\n", string(data))
	require.Equal(t, http.StatusOK, s.Status)
	require.Equal(t, "text/event-stream", s.ContentType)
}

// flushRecorder is a streaming http.ResponseWriter that reports each
// write.
type flushRecorder struct {
	mu     sync.Mutex
	header http.Header
	status int
	writes chan string
}

func (f *flushRecorder) Header() http.Header { return f.header }
func (f *flushRecorder) WriteHeader(s int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status == 0 {
		f.status = s
	}
}
func (f *flushRecorder) Write(b []byte) (int, error) {
	f.writes <- string(b)
	return len(b), nil
}
func (f *flushRecorder) Flush() {}

// countingStream is an event stream handler writing "data: 0", "data: 1",
// … every 20 ms until its client leaves; then it sends the principal it
// ran as on ended, if not nil.
func countingStream(ended chan<- directory.BusPrincipal) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := directory.BusPrincipalFrom(r.Context())
		if ended != nil {
			defer func() { ended <- p }()
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			_, _ = w.Write([]byte("data: " + strconv.Itoa(i) + "\n\n"))
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	})
}

// TestForwardedStreamFlowsAndEndsWithItsClient: a stream another node
// serves reaches the client chunk by chunk while its handler runs, as the
// principal the call names, and the client's disconnect ends the handler
// on the answering node.
func TestForwardedStreamFlowsAndEndsWithItsClient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := natsURL(t)
	caller := streamNode(t, url, "caller", testClusterKey)
	answerer := streamNode(t, url, "answerer", testClusterKey)
	require.NoError(t, answerer.startStreams(ctx))
	require.NoError(t, answerer.nc.Flush())
	t.Cleanup(answerer.streams.close)

	ended := make(chan directory.BusPrincipal, 1)
	h := countingStream(ended)
	answerer.callNext.Store(&h)

	rctx, disconnect := context.WithCancel(ctx)
	r, err := http.NewRequestWithContext(rctx, http.MethodGet, "/api/v1/mesh/env-1/events", nil)
	require.NoError(t, err)
	w := &flushRecorder{header: http.Header{}, writes: make(chan string, 1024)}
	p := directory.BusPrincipal{Agent: "creator@stream.beam.directory", Via: directory.BusAuthAPIKey}
	served := make(chan bool, 1)
	go func() {
		ok, err := caller.streamFrom(w, r, "answerer", p)
		if err != nil {
			t.Log(err)
		}
		served <- ok
	}()
	for i := range 3 {
		select {
		case got := <-w.writes:
			require.Equal(t, "data: "+strconv.Itoa(i)+"\n\n", got)
		case <-ctx.Done():
			t.Fatal("no chunk came")
		}
	}
	require.Equal(t, "text/event-stream", w.Header().Get("Content-Type"))
	disconnect()
	require.True(t, <-served)
	select {
	case got := <-ended:
		require.Equal(t, p, got, "the handler ran as the call's principal")
	case <-ctx.Done():
		t.Fatal("the answering node kept streaming after the client left")
	}
	require.Eventually(t, func() bool { return len(answerer.streams.served) == 0 }, 10*time.Second, 20*time.Millisecond)
}
