package cluster

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// The tests of log shipping and takeover run nodes against one embedded
// JetStream server (R1); the event log they ship is a batch list (batchLog),
// the one thing the cluster sees of tracing's log: opaque batches.

const testDomain = "acme.beam.directory"

// batchLog is a log of opaque batches: what it committed, and what it
// imported from other logs (idempotent by source stream sequence).
type batchLog struct {
	id string

	// duringTail, when set, runs once while Unshipped reads (a writer
	// committing meanwhile).
	duringTail func()

	mu       sync.Mutex
	batches  [][]byte // batch i has last position i+1
	imported []importedBatch
	seen     map[string]uint64
}

// batchSource is where an imported batch came from.
type batchSource struct {
	Log       string
	Node      string
	StreamSeq uint64
}

type importedBatch struct {
	from batchSource
	data string
}

func newBatchLog(id string) *batchLog { return &batchLog{id: id, seen: map[string]uint64{}} }

func (l *batchLog) ID() string { return l.id }

func (l *batchLog) Unshipped(_ context.Context, after int64, fn func([]byte, int64) error) error {
	l.mu.Lock()
	batches := append([][]byte(nil), l.batches...)
	during := l.duringTail
	l.duringTail = nil
	l.mu.Unlock()
	if during != nil {
		during()
	}
	for i, b := range batches {
		if last := int64(i + 1); last > after {
			if err := fn(b, last); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *batchLog) Import(_ context.Context, logID, node string, streamSeq uint64, batch []byte) error {
	from := batchSource{Log: logID, Node: node, StreamSeq: streamSeq}
	l.mu.Lock()
	defer l.mu.Unlock()
	if from.StreamSeq <= l.seen[from.Log] {
		return nil
	}
	l.seen[from.Log] = from.StreamSeq
	l.imported = append(l.imported, importedBatch{from: from, data: string(batch)})
	return nil
}

// commit appends a batch and returns its position, as the log's writer
// does before it calls its replicator.
func (l *batchLog) commit(data string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, []byte(data))
	return int64(len(l.batches))
}

// importedData returns the batches imported from logID, in order.
func (l *batchLog) importedData(logID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, b := range l.imported {
		if b.from.Log == logID {
			out = append(out, b.data)
		}
	}
	return out
}

// testNode is a node under test, its log and its NATS connection.
type testNode struct {
	*Node
	log *batchLog
	nc  *nats.Conn
}

// commit commits data in the node's log and ships it.
func (tn *testNode) commit(ctx context.Context, data string) error {
	return tn.Replicate(ctx, []byte(data), tn.log.commit(data))
}

// crash stops the node as a killed process would: its entry stays in the
// nodes bucket until it expires.
func (tn *testNode) crash() {
	tn.cancel()
	tn.nc.Close()
	tn.wg.Wait()
}

// newLogNode makes a node of the cluster served by s with log lg; Start
// is the caller's.
func newLogNode(t *testing.T, s *server.Server, id string, lg *batchLog,
	adopt func(context.Context, string, string) (map[string]int, error), opts ...func(*Config)) *testNode {
	t.Helper()
	ctx := context.Background()
	tl, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Synchronous: "NORMAL"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tl.Close() })
	reg, err := registry.Open(ctx, tl, registry.Config{DefaultPolicy: registry.PolicyAllow})
	require.NoError(t, err)
	cfg := Config{Domain: testDomain, NodeID: id, Replicas: 1, Registry: reg, Key: testClusterKey,
		Log: lg, Adopt: adopt, TakeoverGrace: 500 * time.Millisecond, Logger: beamtest.Logger(t)}
	for _, o := range opts {
		o(&cfg)
	}
	n, err := New(cfg)
	require.NoError(t, err)
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = n.Close()
		nc.Close()
	})
	return &testNode{Node: n, log: lg, nc: nc}
}

// startLogNode is newLogNode, started.
func startLogNode(t *testing.T, s *server.Server, id string, lg *batchLog,
	adopt func(context.Context, string, string) (map[string]int, error), opts ...func(*Config)) *testNode {
	t.Helper()
	tn := newLogNode(t, s, id, lg, adopt, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, tn.Start(ctx, tn.nc))
	return tn
}

// adoptions records the Adopt calls of every node.
type adoptions struct {
	mu    sync.Mutex
	calls []string // node that adopted: log
}

func (a *adoptions) adopt(node string) func(context.Context, string, string) (map[string]int, error) {
	return func(_ context.Context, logID, of string) (map[string]int, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.calls = append(a.calls, node+":"+logID+"@"+of)
		return map[string]int{"bus": 1}, nil
	}
}

func (a *adoptions) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls...)
}

// logMessages reads every message of a log's subject: data and headers.
func logMessages(t *testing.T, js jetstream.JetStream, logID string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "BEAM_LOG_"+Token(testDomain))
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject("beam.cluster."+Token(testDomain)+".log."+logID))
		if err != nil {
			require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
			return out
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

// publishOnLogA publishes data with the headers hdr on logA's subject, as
// any client of the stream may.
func publishOnLogA(t *testing.T, ctx context.Context, js jetstream.JetStream, data string, hdr map[string]string) {
	t.Helper()
	m := nats.NewMsg("beam.cluster." + Token(testDomain) + ".log.logA")
	m.Data = []byte(data)
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	_, err := js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// record returns the takeover record of logID, nil if none.
func record(t *testing.T, n *testNode, logID string) *takeoverRecord {
	t.Helper()
	rec, _, err := n.takeoverOf(context.Background(), logID)
	require.NoError(t, err)
	return rec
}

func waitDone(t *testing.T, n *testNode, logID string, within time.Duration) *takeoverRecord {
	t.Helper()
	var rec *takeoverRecord
	require.Eventually(t, func() bool {
		rec = record(t, n, logID)
		return rec != nil && rec.State == takeoverDone
	}, within, 50*time.Millisecond, "the takeover of %s was not done", logID)
	return rec
}

// TestLogShipsBatchesInOrder: the batches a log committed before its node
// started ship with its tail, each later one as it commits, one sealed
// message each with its position; a batch shipped is not shipped again;
// a restart ships only what the stream does not have.
func TestLogShipsBatchesInOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, js := jetStreamServer(t)
	lg := newBatchLog("logA")
	lg.commit("b1")
	a := newLogNode(t, s, "a", lg, nil)
	require.NoError(t, a.commit(ctx, "b2"), "before the start a batch is left to the tail")
	lg.duringTail = func() { require.NoError(t, a.commit(ctx, "b3")) }
	require.NoError(t, a.Start(ctx, a.nc))
	require.NoError(t, a.commit(ctx, "b4"))
	require.NoError(t, a.Replicate(ctx, []byte("b4"), 4), "a batch shipped again is a no-op")
	msgs := logMessages(t, js, "logA")
	require.Len(t, msgs, 4, "b3, committed while the tail shipped, is shipped too")
	for i, m := range msgs {
		require.Equal(t, fmt.Sprintf("b%d", i+1), string(m.Data))
		require.Equal(t, strconv.Itoa(i+1), m.Header.Get(headerLogLast))
		_, _, err := a.openBatch("logA", m.Header, m.Data)
		require.NoError(t, err)
	}
	nodes, err := a.Nodes(ctx)
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Equal(t, "logA", nodes[0].LogID, "the node announces its log")

	a.crash()
	lg.commit("b5")
	again := startLogNode(t, s, "a", lg, nil)
	require.NoError(t, again.commit(ctx, "b6"))
	msgs = logMessages(t, js, "logA")
	require.Len(t, msgs, 6)
	require.Equal(t, "b5", string(msgs[4].Data))
	require.Equal(t, "b6", string(msgs[5].Data))
}

// TestFenceFailsTheNextReplicate: once a member fenced a log's subject the
// log's next batch is refused with ErrFenced, the node reports it (Fenced)
// and stops announcing the log.
func TestFenceFailsTheNextReplicate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, js := jetStreamServer(t)
	a := startLogNode(t, s, "a", newBatchLog("logA"), nil)
	require.NoError(t, a.commit(ctx, "b1"))

	b := sealNode(t, "b", testClusterKey)
	tok, err := b.seal(typLogFence, logFence{Log: "logA", Taker: "b"})
	require.NoError(t, err)
	publishOnLogA(t, ctx, js, "", map[string]string{headerLogFence: tok})

	require.ErrorIs(t, a.commit(ctx, "b2"), ErrFenced)
	select {
	case <-a.Fenced():
	default:
		require.FailNow(t, "Fenced is not closed")
	}
	require.ErrorIs(t, a.commit(ctx, "b3"), ErrFenced, "fenced for good")
	a.announce(ctx)
	nodes, err := a.Nodes(ctx)
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Empty(t, nodes[0].LogID, "a fenced node announces no log")
}

// TestTakeoverAfterTheNodeExpires: a node killed (its entry left to
// expire) has its log taken over by the survivor: every batch up to the
// fence imported in order with its stream sequence, the work adopted once,
// the record done; the node started again with that log is refused.
func TestTakeoverAfterTheNodeExpires(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, js := jetStreamServer(t)
	var ad adoptions
	a := startLogNode(t, s, "a", newBatchLog("logA"), ad.adopt("a"))
	b := startLogNode(t, s, "b", newBatchLog("logB"), ad.adopt("b"))
	for i := 1; i <= 5; i++ {
		require.NoError(t, a.commit(ctx, fmt.Sprintf("a%d", i)))
	}
	require.NoError(t, b.commit(ctx, "b1"))
	a.crash()
	killed := time.Now()

	rec := waitDone(t, b, "logA", 30*time.Second)
	t.Logf("taken over %s after the kill", time.Since(killed))
	require.Equal(t, []string{"a1", "a2", "a3", "a4", "a5"}, b.log.importedData("logA"))
	seqs := []uint64{}
	b.log.mu.Lock()
	imported := append([]importedBatch(nil), b.log.imported...)
	b.log.mu.Unlock()
	for _, imp := range imported {
		require.Equal(t, batchSource{Log: "logA", Node: "a", StreamSeq: imp.from.StreamSeq}, imp.from)
		seqs = append(seqs, imp.from.StreamSeq)
	}
	require.IsIncreasing(t, seqs)
	require.Equal(t, []string{"b:logA@a"}, ad.list(), "adopted once")
	require.Equal(t, "a", rec.Node)
	require.Equal(t, "b", rec.Taker)
	require.Equal(t, "logB", rec.TakerLog)
	require.Equal(t, 5, rec.Batches)
	require.Equal(t, map[string]int{"bus": 1}, rec.Adopted)
	var done, took dto.Metric
	require.NoError(t, b.take.count.WithLabelValues("done").Write(&done))
	require.Equal(t, 1.0, done.GetCounter().GetValue())
	require.NoError(t, b.take.duration.Write(&took))
	require.Equal(t, uint64(1), took.GetHistogram().GetSampleCount())
	require.Empty(t, a.log.importedData("logA"))

	msgs := logMessages(t, js, "logA")
	require.Len(t, msgs, 1, "the subject is purged down to its fence")
	require.NoError(t, b.openFence("logA", msgs[0].Header))

	st, err := b.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.(status).Takeovers, 1)
	require.Equal(t, "logA", st.(status).Takeovers[0].Log)

	restarted := newLogNode(t, s, "a", a.log, nil)
	require.ErrorIs(t, restarted.Start(ctx, restarted.nc), ErrFenced, "a node found its log taken over")

	// Without its record (deleted by a client of the bucket) the fence
	// left on the subject still refuses the log.
	kv, err := js.KeyValue(ctx, "BEAM_TAKEOVER_"+Token(testDomain))
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "takeover.logA"))
	again := newLogNode(t, s, "a", a.log, nil)
	require.ErrorIs(t, again.Start(ctx, again.nc), ErrFenced, "a taken-over log served again")
	require.Equal(t, []string{"b:logA@a"}, ad.list())
}

// TestIdleHomeIsTakenOver: the job bus's home dies before its log shipped a
// batch (it had served nothing yet); its log has no subject in the stream,
// yet a survivor takes it over and the home moves, so the job bus does not
// answer 503 on every node until the dead node returns.
func TestIdleHomeIsTakenOver(t *testing.T) {
	t.Parallel()
	s, js := jetStreamServer(t)
	jobBus := func(c *Config) { c.JobBus, c.LogID = true, c.Log.ID() }
	var ad adoptions
	a := startLogNode(t, s, "a", newBatchLog("logA"), ad.adopt("a"), jobBus)
	b := startLogNode(t, s, "b", newBatchLog("logB"), ad.adopt("b"), jobBus)
	home, ok := b.home(homeJobs)
	require.True(t, ok)
	require.Equal(t, "a", home)
	require.Empty(t, logMessages(t, js, "logA"), "a shipped nothing")
	a.crash()

	rec := waitDone(t, b, "logA", 30*time.Second)
	require.Equal(t, "a", rec.Node)
	require.Equal(t, 0, rec.Batches)
	require.Equal(t, []string{"b:logA@a"}, ad.list())
	require.Eventually(t, func() bool { return b.isHome(homeJobs) }, 10*time.Second, 50*time.Millisecond,
		"the home moved to the taker")
	msgs := logMessages(t, js, "logA")
	require.Len(t, msgs, 1)
	require.NoError(t, b.openFence("logA", msgs[0].Header), "the empty log is fenced")

	// Had the move failed (the bucket unavailable), the home would still
	// name the lost log once the takeover is done: the taker moves it on a
	// later tick.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, err := a.seal(typHomeEntry, a.homeFor(homeJobs, "a"))
	require.NoError(t, err)
	e, err := b.homes.kv.Get(ctx, homeJobs)
	require.NoError(t, err)
	stale, err := b.homes.kv.Update(ctx, homeJobs, []byte(tok), e.Revision())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		e, err := b.homes.kv.Get(ctx, homeJobs)
		if err != nil || e.Revision() <= stale {
			return false
		}
		h, err := b.homeOf(e)
		return err == nil && h.Node == "b" && h.Log == "logB"
	}, 10*time.Second, 50*time.Millisecond, "the taker moved the home it had taken over")
}

// TestTwoSurvivorsTakeOverOnce: when a node leaves, the two survivors race
// for its log and one of them takes it over.
func TestTwoSurvivorsTakeOverOnce(t *testing.T) {
	t.Parallel()
	s, _ := jetStreamServer(t)
	survivorsRace(t, []*server.Server{s, s, s}, 1)
}

// TestTakeoverOnAReplicatedStream: on three routed servers (the stream and
// bucket R3), nodes on different servers ship, fence and take over as on
// one.
func TestTakeoverOnAReplicatedStream(t *testing.T) {
	t.Parallel()
	survivorsRace(t, jetStreamCluster(t), 3)
}

// survivorsRace runs nodes a, b and c on servers (R replicas); a ships and
// leaves, and one of b and c imports every batch of a's log once, in
// order, and adopts its work; a's next batch is refused.
func survivorsRace(t *testing.T, servers []*server.Server, replicas int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var ad adoptions
	start := func(s *server.Server, id string) *testNode {
		tn := newLogNode(t, s, id, newBatchLog("log"+strings.ToUpper(id)), ad.adopt(id))
		tn.cfg.Replicas = replicas
		require.NoError(t, tn.Start(ctx, tn.nc))
		return tn
	}
	a, b, c := start(servers[0], "a"), start(servers[1], "b"), start(servers[2], "c")
	for i := 1; i <= 4; i++ {
		require.NoError(t, a.commit(ctx, fmt.Sprintf("a%d", i)))
	}
	require.NoError(t, a.Close())

	rec := waitDone(t, b, "logA", time.Minute)
	taker, other := b, c
	if rec.Taker == "c" {
		taker, other = c, b
	}
	require.Equal(t, []string{"a1", "a2", "a3", "a4"}, taker.log.importedData("logA"))
	require.Empty(t, other.log.importedData("logA"))
	require.Equal(t, []string{rec.Taker + ":logA@a"}, ad.list())
	require.ErrorIs(t, a.commit(ctx, "a5"), ErrFenced, "the lost log wrote after the fence")
}

// TestTakeoverLeftUnfinishedIsRedone: a taker that dies before it marks
// the takeover done leaves the record importing; the other survivor takes
// it again and does it whole.
func TestTakeoverLeftUnfinishedIsRedone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _ := jetStreamServer(t)
	var ad adoptions
	stuck := make(chan string, 1)
	var once sync.Once
	adoptOrHang := func(node string) func(context.Context, string, string) (map[string]int, error) {
		done := ad.adopt(node)
		return func(ctx context.Context, logID, of string) (map[string]int, error) {
			first := false
			once.Do(func() { first = true })
			if first {
				stuck <- node
				<-ctx.Done() // dies here
				return nil, ctx.Err()
			}
			return done(ctx, logID, of)
		}
	}
	a := startLogNode(t, s, "a", newBatchLog("logA"), nil)
	b := startLogNode(t, s, "b", newBatchLog("logB"), adoptOrHang("b"))
	c := startLogNode(t, s, "c", newBatchLog("logC"), adoptOrHang("c"))
	for i := 1; i <= 3; i++ {
		require.NoError(t, a.commit(ctx, fmt.Sprintf("a%d", i)))
	}
	require.NoError(t, a.Close())

	var first string
	select {
	case first = <-stuck:
	case <-ctx.Done():
		require.FailNow(t, "no takeover started")
	}
	dying, survivor := b, c
	if first == "c" {
		dying, survivor = c, b
	}
	rec := record(t, survivor, "logA")
	require.NotNil(t, rec)
	require.Equal(t, takeoverImporting, rec.State)
	require.Equal(t, first, rec.Taker)
	require.Equal(t, []string{"a1", "a2", "a3"}, dying.log.importedData("logA"))
	require.NoError(t, dying.Close())

	rec = waitDone(t, survivor, "logA", 30*time.Second)
	require.Equal(t, survivor.cfg.NodeID, rec.Taker)
	require.Equal(t, []string{"a1", "a2", "a3"}, survivor.log.importedData("logA"), "imported whole, up to the first fence")
	require.Equal(t, 3, rec.Batches)
	require.Equal(t, []string{survivor.cfg.NodeID + ":logA@a"}, ad.list())
}

// TestForgedLogMessagesAreIgnored (attack): a client of the stream without
// the cluster's key publishes on a node's log subject — junk, a batch with
// made-up headers, a fence and a batch sealed by another key, and a copy
// of one of the node's own batches. The node keeps shipping (none of them
// fences it), and the taker imports the node's own batches only, each
// once, in order.
func TestForgedLogMessagesAreIgnored(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, js := jetStreamServer(t)
	var ad adoptions
	a := startLogNode(t, s, "a", newBatchLog("logA"), nil)
	b := startLogNode(t, s, "b", newBatchLog("logB"), ad.adopt("b"))
	publish := func(data string, hdr map[string]string) { t.Helper(); publishOnLogA(t, ctx, js, data, hdr) }
	stranger := sealNode(t, "a", ed25519Key(t))

	require.NoError(t, a.commit(ctx, "a1"))
	publish("junk", nil)
	require.NoError(t, a.commit(ctx, "a2"), "junk on the subject fenced the node")

	tok, err := stranger.seal(typLogFence, logFence{Log: "logA", Taker: "a"})
	require.NoError(t, err)
	publish("", map[string]string{headerLogFence: tok})
	require.NoError(t, a.commit(ctx, "a3"), "a fence sealed by another key fenced the node")

	tok, err = stranger.seal(typLogBatch, logBatch{Log: "logA", Node: "a", Last: 4, Digest: digest([]byte("forged"))})
	require.NoError(t, err)
	publish("forged", map[string]string{headerLogLast: "4", headerSeal: tok})
	publish("made up", map[string]string{headerLogLast: "5", headerSeal: "e30.e30.e30"})
	first := logMessages(t, js, "logA")[0]
	publish(string(first.Data), map[string]string{headerLogLast: first.Header.Get(headerLogLast), headerSeal: first.Header.Get(headerSeal)})
	require.NoError(t, a.commit(ctx, "a4"), "forged batches fenced the node")
	select {
	case <-a.Fenced():
		require.FailNow(t, "the node gave up its log")
	default:
	}

	a.crash()
	waitDone(t, b, "logA", 30*time.Second)
	require.Equal(t, []string{"a1", "a2", "a3", "a4"}, b.log.importedData("logA"), "forged batches imported")
	require.Equal(t, []string{"b:logA@a"}, ad.list())
}

// TestForgedTakeoverRecordIsIgnored (attack): a client of the takeover
// bucket without the cluster's key writes a record for a live node's log
// — unsealed, or another log's real record copied under its key. The node
// still starts with its log and ships it; when it is gone, a survivor
// replaces the forged record and takes the log over.
func TestForgedTakeoverRecordIsIgnored(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, js := jetStreamServer(t)
	var ad adoptions
	a := startLogNode(t, s, "a", newBatchLog("logA"), nil)
	b := startLogNode(t, s, "b", newBatchLog("logB"), ad.adopt("b"))
	require.NoError(t, a.commit(ctx, "a1"))
	kv, err := js.KeyValue(ctx, "BEAM_TAKEOVER_"+Token(testDomain))
	require.NoError(t, err)

	_, err = kv.Put(ctx, "takeover.logA", []byte(`{"log":"logA","taker":"b","takerLog":"logB","state":"done"}`))
	require.NoError(t, err)
	a.crash()
	again := startLogNode(t, s, "a", a.log, nil)
	require.NoError(t, again.commit(ctx, "a2"))

	// A real record of another log, copied under this log's key.
	c := startLogNode(t, s, "c", newBatchLog("logC"), nil)
	require.NoError(t, c.commit(ctx, "c1"))
	require.NoError(t, c.Close())
	real := waitDone(t, b, "logC", 30*time.Second)
	require.Equal(t, "logC", real.Log)
	e, err := kv.Get(ctx, "takeover.logC")
	require.NoError(t, err)
	_, err = kv.Put(ctx, "takeover.logA", e.Value())
	require.NoError(t, err)
	again.crash()
	restarted := startLogNode(t, s, "a", a.log, nil)
	require.NoError(t, restarted.commit(ctx, "a3"))

	require.NoError(t, restarted.Close())
	rec := waitDone(t, b, "logA", 30*time.Second)
	require.Equal(t, "b", rec.Taker)
	require.Equal(t, []string{"a1", "a2", "a3"}, b.log.importedData("logA"))
	require.Contains(t, ad.list(), "b:logA@a")
}

// ed25519Key is a key that is not the cluster's.
func ed25519Key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return key
}

// TestLostAcknowledgementIsNotShippedTwice: a batch the stream stored but
// whose acknowledgement the node never got is found on the subject when
// the node publishes it again — also behind a message someone without the
// key wrote after it — and counts as shipped: it is not stored twice, and
// the next batch follows.
func TestLostAcknowledgementIsNotShippedTwice(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, js := jetStreamServer(t)
	a := startLogNode(t, s, "a", newBatchLog("logA"), nil)
	require.NoError(t, a.commit(ctx, "b1"))

	// What a's publish of b2 stores, its acknowledgement lost.
	tok, err := a.seal(typLogBatch, logBatch{Log: "logA", Node: "a", Last: 2, Digest: digest([]byte("b2"))})
	require.NoError(t, err)
	publishOnLogA(t, ctx, js, "b2", map[string]string{headerLogLast: "2", headerSeal: tok})
	// And someone without the key wrote after it.
	publishOnLogA(t, ctx, js, "junk", nil)

	require.NoError(t, a.commit(ctx, "b2"))
	require.NoError(t, a.commit(ctx, "b3"))
	var got []string
	for _, m := range logMessages(t, js, "logA") {
		got = append(got, string(m.Data))
	}
	require.Equal(t, []string{"b1", "b2", "junk", "b3"}, got)
}

// TestFailedShipIsShippedBeforeTheNext: a batch that could not be shipped
// (the stream unreachable) is an error for its appenders, and the next
// batch ships it first: the stream never skips a batch the log committed.
func TestFailedShipIsShippedBeforeTheNext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, opts := stoppableServer(t)
	a := startLogNode(t, s, "a", newBatchLog("logA"), nil)
	require.NoError(t, a.commit(ctx, "b1"))
	s.Shutdown()
	s.WaitForShutdown()

	down, stop := context.WithTimeout(ctx, time.Second)
	err := a.commit(down, "b2")
	stop()
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrFenced)

	back := restartServer(t, opts)
	require.NoError(t, a.commit(ctx, "b3"))
	nc, err := nats.Connect(back.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var got []string
	for _, m := range logMessages(t, js, "logA") {
		got = append(got, string(m.Data))
	}
	require.Equal(t, []string{"b1", "b2", "b3"}, got)
}

// jetStreamCluster starts three embedded NATS servers routed into one
// JetStream cluster on loopback and returns them once it has a meta
// leader.
func jetStreamCluster(t *testing.T) []*server.Server {
	t.Helper()
	ports := make([]int, 3)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		require.NoError(t, ln.Close())
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	servers := make([]*server.Server, 3)
	for i := range servers {
		s, err := server.NewServer(&server.Options{ServerName: fmt.Sprintf("s%d", i), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoSigs: true, Routes: routes,
			Cluster: server.ClusterOpts{Name: "beam-test", Host: "127.0.0.1", Port: ports[i]}})
		require.NoError(t, err)
		s.Start()
		t.Cleanup(s.Shutdown)
		servers[i] = s
	}
	for _, s := range servers {
		require.True(t, s.ReadyForConnections(10*time.Second))
	}
	require.Eventually(t, func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "no JetStream meta leader")
	return servers
}
