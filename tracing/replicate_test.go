package tracing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// testKVOp is an op kind of the tests: it upserts a row of test_kv.
const testKVOp = "test.kv"

func init() {
	RegisterOp(testKVOp, func(tx *sqlx.Tx, payload []byte) error {
		var p struct{ K, V string }
		if err := json.Unmarshal(payload, &p); err != nil {
			return err
		}
		if p.K == "" {
			return errors.New("empty key")
		}
		if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS test_kv(k TEXT PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
			return err
		}
		_, err := tx.Exec(`INSERT OR REPLACE INTO test_kv(k, v) VALUES(?, ?)`, p.K, p.V)
		return err
	})
}

func kvOp(k, v string) Op {
	return Op{Kind: testKVOp, Payload: json.RawMessage(fmt.Sprintf(`{"K":%q,"V":%q}`, k, v))}
}

// shipped is one batch a recorder accepted.
type shipped struct {
	batch []byte
	last  int64
}

// recorder is a Replicator that keeps what it is given. fail, when set,
// answers a call instead; gate, when set, holds each call until it can
// receive; calls receives each call's lastSeq before it is answered.
type recorder struct {
	mu      sync.Mutex
	batches []shipped
	fail    func(n int) error
	n       int
	gate    chan struct{}
	calls   chan int64
}

func (r *recorder) Replicate(ctx context.Context, batch []byte, last int64) error {
	if r.calls != nil {
		r.calls <- last
	}
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.fail != nil {
		if err := r.fail(r.n); err != nil {
			return err
		}
	}
	r.batches = append(r.batches, shipped{batch: append([]byte(nil), batch...), last: last})
	return nil
}

func (r *recorder) accepted() []shipped {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]shipped(nil), r.batches...)
}

func withReplicator(rep Replicator) func(*Config) {
	return func(c *Config) { c.Replicator = rep }
}

// items decodes the items of batches, in order, and checks that they
// follow each other without gap or overlap from position from.
func items(t *testing.T, from int64, bs []shipped) []batchItem {
	t.Helper()
	var out []batchItem
	for _, s := range bs {
		d, err := decodeBatch(s.batch)
		require.NoError(t, err)
		require.Equal(t, from, d.From, "batches follow each other")
		require.Equal(t, s.last, d.To)
		from = d.To
		out = append(out, d.Items...)
	}
	return out
}

// tables reads what a taker must have of the source: intent_log,
// beam_messages and beam_mesh rows without their seqs, and test_kv.
func tables(t *testing.T, l *Log) map[string][]map[string]any {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, l.sync(ctx))
	out := map[string][]map[string]any{}
	for name, q := range map[string]string{
		"intent_log": `SELECT nonce, from_beam_id, to_beam_id, intent_type, owner, status, requested_at, client_timestamp,
			attempt, transport, timeout_ms, error_code, completed_at, round_trip_latency_ms, result_json, updated_at
			FROM intent_log ORDER BY nonce`,
		"beam_messages": `SELECT * FROM beam_messages ORDER BY nonce`,
		"beam_mesh":     `SELECT * FROM beam_mesh ORDER BY 1`,
		"test_kv":       `SELECT * FROM test_kv ORDER BY k`,
	} {
		if name == "test_kv" {
			var n int
			if l.ReadDB().Get(&n, `SELECT COUNT(*) FROM sqlite_master WHERE name = 'test_kv'`) != nil || n == 0 {
				continue
			}
		}
		out[name] = beamtest.Rows(t, l.ReadDB(), q, "last_seq", "first_seq")
	}
	return out
}

// fill appends a mix of every kind of item: directory intents, bus
// messages (one finished, one not), a job, a pipeline envelope and ops.
func fill(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	for i := range 3 {
		n := fmt.Sprintf("dir-%d", i)
		b.append(received(n), ev(n, Validated))
		b.append(ev(n, Dispatched), ev(n, Delivered), ev(n, Acked))
	}
	b.append(busReceived("bus-open", "m-open"), ev("bus-open", Validated))
	b.append(ev("bus-open", Queued))
	b.append(busReceived("bus-done", "m-done"), ev("bus-done", Validated), ev("bus-done", Queued))
	_, err := b.log.DoOps(ctx, []Op{kvOp("a", "1"), kvOp("b", "2")}, ev("bus-done", Dispatched), ev("bus-done", Delivered))
	require.NoError(t, err)
	b.append(ev("bus-done", Acked))
	for _, c := range jobEvents("job:j1")[:3] {
		b.append(c...)
	}
	meshSteps(b, "env1", 2)
	_, err = b.log.DoOps(ctx, []Op{kvOp("a", "3")})
	require.NoError(t, err)
}

// TestShippedBatchesImportIntoAnotherLog: every committed request reaches
// the replicator in order; a second log importing the batches has the same
// projections and side tables, with the events' times, fields and
// details kept and details.takenOver added; importing them again changes
// nothing.
func TestShippedBatchesImportIntoAnotherLog(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	src := setup(t, withReplicator(rec))
	fill(t, src)
	require.NotEmpty(t, src.log.ID())
	bs := rec.accepted()
	its := items(t, 0, bs)
	require.Equal(t, src.log.Position(), bs[len(bs)-1].last)
	require.Equal(t, src.log.LastSeq()+3, src.log.Position(), "events plus three ops")
	ops := 0
	for _, it := range its {
		if it.Op != "" {
			ops++
		}
	}
	require.Equal(t, 3, ops)

	dst := setup(t)
	require.NotEqual(t, src.log.ID(), dst.log.ID())
	ctx := context.Background()
	unfinished := map[Owner]map[string]bool{}
	for i, s := range bs {
		res, err := dst.log.Import(ctx, ImportSource{Log: src.log.ID(), Node: "n1", StreamSeq: uint64(i + 1)}, s.batch)
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		for o, ns := range res.Unfinished {
			for _, n := range ns {
				if unfinished[o] == nil {
					unfinished[o] = map[string]bool{}
				}
				unfinished[o][n] = true
			}
		}
		for _, ns := range res.Finished {
			for _, n := range ns {
				for o := range unfinished {
					delete(unfinished[o], n)
				}
			}
		}
	}
	require.Equal(t, tables(t, src.log), tables(t, dst.log))
	require.Equal(t, map[string]bool{"bus-open": true}, unfinished[OwnerBus])
	require.Equal(t, map[string]bool{"job:j1": true}, unfinished[OwnerJobs])
	require.Empty(t, unfinished[OwnerMesh], "the envelope finished")

	want, err := src.log.Trace(ctx, "bus-done")
	require.NoError(t, err)
	got, err := dst.log.Trace(ctx, "bus-done")
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].At, got[i].At)
		require.Equal(t, want[i].State, got[i].State)
		require.Equal(t, want[i].From, got[i].From)
		require.Equal(t, map[string]any{"log": src.log.ID(), "node": "n1", "seq": json.Number(fmt.Sprint(want[i].Seq))},
			got[i].Details.Extra[takenOverKey])
		got[i].Details.Extra = nil
		require.Equal(t, want[i].Details, got[i].Details)
	}

	// Again, whole or overlapping: nothing changes.
	last := dst.log.LastSeq()
	again := map[string]bool{}
	for i, s := range bs {
		res, err := dst.log.Import(ctx, ImportSource{Log: src.log.ID(), Node: "n1", StreamSeq: uint64(i + 1)}, s.batch)
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		for _, n := range res.Unfinished[OwnerBus] {
			again[n] = true
		}
	}
	require.Equal(t, map[string]bool{"bus-open": true}, again, "a duplicate lists its items as they stand")
	all := shippedTail(t, src.log, 0)
	res, err := dst.log.Import(ctx, ImportSource{Log: src.log.ID(), Node: "n1"}, all[0].batch)
	require.NoError(t, err)
	require.Zero(t, res.Events+res.Ops)
	require.Equal(t, last, dst.log.LastSeq())
	require.Equal(t, tables(t, src.log), tables(t, dst.log))

	// The taker's projections are a refold of its log.
	_, err = dst.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, tables(t, src.log), tables(t, dst.log))
}

// shippedTail collects what Unshipped gives after afterSeq.
func shippedTail(t *testing.T, l *Log, afterSeq int64) []shipped {
	t.Helper()
	var out []shipped
	require.NoError(t, l.Unshipped(context.Background(), afterSeq, func(b []byte, last int64) error {
		out = append(out, shipped{batch: append([]byte(nil), b...), last: last})
		return nil
	}))
	return out
}

// TestUnshippedIsTheTail: Unshipped after any shipped position re-encodes
// exactly the items shipped after it (events and ops, in order), and
// nothing after the last.
func TestUnshippedIsTheTail(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	src := setup(t, withReplicator(rec))
	fill(t, src)
	bs := rec.accepted()
	all := items(t, 0, bs)
	for k := range bs {
		after := int64(0)
		if k > 0 {
			after = bs[k-1].last
		}
		want := items(t, after, bs[k:])
		tail := shippedTail(t, src.log, after)
		require.Equal(t, want, items(t, after, tail), "after %d", after)
	}
	require.Empty(t, shippedTail(t, src.log, src.log.Position()))
	require.Len(t, all, int(src.log.Position()))
}

// TestAppendWaitsForReplicate: an appender of a durable item is released
// only after Replicate returned nil for its batch; the writer meanwhile
// commits the next batch.
func TestAppendWaitsForReplicate(t *testing.T) {
	t.Parallel()
	rec := &recorder{gate: make(chan struct{}), calls: make(chan int64, 16)}
	b := setup(t, withReplicator(rec))
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := b.log.Append(ctx, busReceived("w-1", "m-w1"))
		done <- err
	}()
	<-rec.calls // Replicate is running for w-1's batch
	select {
	case err := <-done:
		t.Fatalf("Append returned before Replicate did: %v", err)
	default:
	}
	// The writer is free: a second append commits while the first ships.
	done2 := make(chan error, 1)
	go func() {
		_, err := b.log.Append(ctx, busReceived("w-2", "m-w2"))
		done2 <- err
	}()
	require.Eventually(t, func() bool { return b.log.LastSeq() == 2 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Append returned before Replicate did: %v", err)
	default:
	}
	rec.gate <- struct{}{}
	require.NoError(t, <-done)
	<-rec.calls
	rec.gate <- struct{}{}
	require.NoError(t, <-done2)
	require.Len(t, rec.accepted(), 2)
}

// TestDirectoryIntentsReleasedAtCommit: a request of directory intents
// only is answered at commit, while its items still reach the replicator
// in commit order with the durable ones.
func TestDirectoryIntentsReleasedAtCommit(t *testing.T) {
	t.Parallel()
	rec := &recorder{gate: make(chan struct{}), calls: make(chan int64, 16)}
	b := setup(t, withReplicator(rec))
	ctx := context.Background()
	durable := make(chan error, 1)
	go func() {
		_, err := b.log.Append(ctx, busReceived("d-bus", "m-d"))
		durable <- err
	}()
	<-rec.calls // the bus message's batch is replicating
	b.append(received("d-dir"), ev("d-dir", Validated))
	b.append(ev("d-dir", Dispatched))
	select {
	case err := <-durable:
		t.Fatalf("the durable append returned before Replicate did: %v", err)
	default:
	}
	rec.gate <- struct{}{}
	require.NoError(t, <-durable)
	<-rec.calls
	rec.gate <- struct{}{}
	require.Eventually(t, func() bool {
		bs := rec.accepted()
		return len(bs) == 2 && bs[1].last == b.log.Position()
	}, 10*time.Second, time.Millisecond)
	its := items(t, 0, rec.accepted())
	require.Len(t, its, 4)
	require.Equal(t, []string{"d-bus", "d-dir", "d-dir", "d-dir"}, []string{its[0].Nonce, its[1].Nonce, its[2].Nonce, its[3].Nonce})
	require.Equal(t, Dispatched, its[3].State)
}

// TestReplicateFailureFailsAppendKeepsOrder: an append whose batch the
// replicator refused fails with ErrNotReplicated, never succeeds; its
// items go to the replicator again, before any later ones.
func TestReplicateFailureFailsAppendKeepsOrder(t *testing.T) {
	t.Parallel()
	boom := errors.New("stream unavailable")
	rec := &recorder{fail: func(n int) error {
		if n <= 2 {
			return boom
		}
		return nil
	}}
	b := setup(t, withReplicator(rec))
	ctx := context.Background()
	_, err := b.log.Append(ctx, busReceived("f-1", "m-f1"))
	require.ErrorIs(t, err, ErrNotReplicated)
	require.ErrorIs(t, err, boom)
	require.Eventually(t, func() bool { return len(rec.accepted()) > 0 }, 10*time.Second, time.Millisecond)
	_, err = b.log.DoOps(ctx, []Op{kvOp("k", "v")}, ev("f-1", Validated))
	require.NoError(t, err)
	its := items(t, 0, rec.accepted())
	require.Len(t, its, 3)
	require.Equal(t, "f-1", its[0].Nonce)
	require.Equal(t, Received, its[0].State)
	require.Equal(t, Validated, its[1].State)
	require.Equal(t, testKVOp, its[2].Op)
	require.Equal(t, 2.0, b.metric("beam_log_ship_failures_total"))
	require.Positive(t, b.metric("beam_log_ship_seconds"))
}

// TestFencedLogRefusesAppends: once the replicator reports ErrFenced, the
// appender fails, Fenced is closed, and every later append fails at once
// without reaching the replicator.
func TestFencedLogRefusesAppends(t *testing.T) {
	t.Parallel()
	rec := &recorder{fail: func(int) error { return fmt.Errorf("publish: wrong last sequence: %w", ErrFenced) }}
	b := setup(t, withReplicator(rec))
	ctx := context.Background()
	_, err := b.log.Append(ctx, busReceived("x-1", "m-x1"))
	require.ErrorIs(t, err, ErrFenced)
	require.ErrorIs(t, err, ErrNotReplicated)
	select {
	case <-b.log.Fenced():
	case <-time.After(10 * time.Second):
		t.Fatal("Fenced not closed")
	}
	rec.mu.Lock()
	calls := rec.n
	rec.mu.Unlock()
	_, err = b.log.Append(ctx, received("x-2"))
	require.ErrorIs(t, err, ErrFenced)
	_, err = b.log.DoOps(ctx, []Op{kvOp("k", "v")})
	require.ErrorIs(t, err, ErrFenced)
	rec.mu.Lock()
	require.Equal(t, calls, rec.n, "nothing more was shipped")
	rec.mu.Unlock()
	require.Equal(t, State(""), b.state("x-2"))
}

// TestImportNonceCollisions: the taker already has events of nonces the
// imported log has. A directory intent stays the taker's own (the
// source's events of it are skipped); a durable bus message the taker
// holds only as the holder's directory trace of one attempt is adopted
// with the owner's lifecycle (message row and all); the result stays a
// refold of the taker's log.
func TestImportNonceCollisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{}
	src := setup(t, withReplicator(rec))
	src.append(received("c-dir"), ev("c-dir", Validated), ev("c-dir", Dispatched))
	src.append(busReceived("c-bus", "m-c"), ev("c-bus", Validated), ev("c-bus", Queued), ev("c-bus", Dispatched))

	dst := setup(t)
	dst.append(received("c-dir"), ev("c-dir", Validated))
	dst.append(ev("c-dir", Failed))
	held := received("c-bus")
	held.Transport = "cluster"
	dst.append(held, ev("c-bus", Validated), ev("c-bus", Dispatched), ev("c-bus", Delivered))

	var unfinished []string
	for i, s := range rec.accepted() {
		res, err := dst.log.Import(ctx, ImportSource{Log: src.log.ID(), Node: "n1", StreamSeq: uint64(i + 1)}, s.batch)
		require.NoError(t, err)
		unfinished = append(unfinished, res.Unfinished[OwnerBus]...)
	}
	require.Equal(t, []string{"c-bus"}, unfinished)
	require.Equal(t, Failed, dst.state("c-dir"), "the taker's own directory trace stands")
	row, ok, err := dst.log.Intent(ctx, "c-bus")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, OwnerBus, row.Owner)
	require.Equal(t, Dispatched, row.Status)
	msg, ok, err := dst.log.Message(ctx, "c-bus")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "m-c", msg.ID)
	tr, err := dst.log.Trace(ctx, "c-bus")
	require.NoError(t, err)
	require.Len(t, tr, 4, "the owner's lifecycle")

	// The adopted item goes on under the taker's rules.
	dst.append(ev("c-bus", Queued))
	before := tables(t, dst.log)
	_, err = dst.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, before, tables(t, dst.log))
	dst.reopen()
	require.Equal(t, before, tables(t, dst.log))
}

// TestImportLeavesHoldersRelaysOut: the lost log relayed, as the holder of
// an agent's session, a frame another node handed over (its received event
// names that node, details.fromNode). That nonce is the other node's to
// retry or answer: the taker imports none of it and adopts nothing, so the
// owner's next attempt, handed to the taker, is not met by a stale trace.
func TestImportLeavesHoldersRelaysOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{}
	src := setup(t, withReplicator(rec))
	relayed := received("h-1")
	relayed.Transport = "cluster"
	relayed.Details.Extra = map[string]any{"fromNode": "node0", "busMessageId": "m-h1"}
	src.append(relayed, ev("h-1", Validated), ev("h-1", Dispatched))
	src.append(received("own-1"), ev("own-1", Validated), ev("own-1", Dispatched))

	dst := setup(t)
	unfinished := map[Owner][]string{}
	for i, s := range rec.accepted() {
		res, err := dst.log.Import(ctx, ImportSource{Log: src.log.ID(), Node: "n1", StreamSeq: uint64(i + 1)}, s.batch)
		require.NoError(t, err)
		for o, ns := range res.Unfinished {
			unfinished[o] = append(unfinished[o], ns...)
		}
	}
	for _, ns := range unfinished {
		require.NotContains(t, ns, "h-1", "nothing of the relay is adopted")
	}
	require.Equal(t, State(""), dst.state("h-1"), "the holder's relay is not imported")
	require.Equal(t, Dispatched, dst.state("own-1"))
}

// TestLogIDKeptInTheFile: the ID is made with the file and survives a
// reopen; another file has another.
func TestLogIDKeptInTheFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.log.ID()
	require.Len(t, id, 32)
	b.reopen()
	require.Equal(t, id, b.log.ID())
	ro, err := OpenReadOnly(context.Background(), b.path)
	require.NoError(t, err)
	require.Equal(t, id, ro.ID())
	require.NoError(t, ro.Close())
	require.NotEqual(t, id, setup(t).log.ID())
}

// TestSingleNodeRecordsNoOps: without a replicator DoOps applies its ops
// and records none; appenders never wait for a shipper.
func TestSingleNodeRecordsNoOps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.log.DoOps(context.Background(), []Op{kvOp("a", "1")}, received("s-1"))
	require.NoError(t, err)
	var n int
	require.NoError(t, b.log.ReadDB().Get(&n, `SELECT COUNT(*) FROM log_ops`))
	require.Zero(t, n)
	require.NoError(t, b.log.ReadDB().Get(&n, `SELECT COUNT(*) FROM test_kv`))
	require.Equal(t, 1, n)
	require.Nil(t, b.log.ship)
	_, err = b.log.DoOps(context.Background(), []Op{{Kind: "no.such", Payload: json.RawMessage(`{}`)}})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
}

// FuzzBatchRoundTrip: whatever decodes encodes to a batch that decodes to
// the same items, and encodes to the same bytes again.
func FuzzBatchRoundTrip(f *testing.F) {
	rec := &recorder{}
	dir := f.TempDir()
	l, err := Open(context.Background(), Config{Path: filepath.Join(dir, "beam.db"), Logger: quiet, Replicator: rec})
	require.NoError(f, err)
	b := &testBundle{log: l}
	_, err = l.Append(context.Background(), busReceived("fz", "m-fz"), ev("fz", Validated))
	require.NoError(f, err)
	_, err = l.DoOps(context.Background(), []Op{kvOp("k", "<&>é")}, ev("fz", Queued))
	require.NoError(f, err)
	require.NoError(f, b.log.Close())
	for _, s := range rec.accepted() {
		f.Add(s.batch)
	}
	f.Add([]byte(`{"v":1,"from":0,"to":0,"items":[]}`))
	f.Add([]byte(`{"v":1,"from":3,"to":9,"items":[{"pos":5,"op":"x","payload":[1]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeBatch(data)
		if err != nil {
			return
		}
		enc := encodeDoc(d)
		d2, err := decodeBatch(enc)
		require.NoError(t, err, string(enc))
		require.Equal(t, len(d.Items), len(d2.Items))
		enc2 := encodeDoc(d2)
		require.Equal(t, string(enc), string(enc2))
		from, err := BatchFrom(enc)
		require.NoError(t, err)
		require.Equal(t, d.From, from)
	})
}

// TestImportSkipsOpsThatFailHere: an imported op of an unknown kind, or
// one whose function fails on the taker, is skipped (logged), and the rest
// of the batch is imported; a batch that does not decode is refused whole.
func TestImportSkipsOpsThatFailHere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	batch := []byte(`{"v":1,"from":0,"to":4,"items":[` +
		`{"pos":1,"op":"test.kv","payload":{"K":"","V":"x"}},` +
		`{"pos":2,"op":"no.such","payload":{}},` +
		`{"pos":3,"seq":1,"nonce":"i-1","state":"received","at":1767323045001000,"from":"a@x.beam.directory","to":"b@x.beam.directory","type":"t","details":{}},` +
		`{"pos":4,"op":"test.kv","payload":{"K":"k","V":"v"}}]}`)
	res, err := b.log.Import(ctx, ImportSource{Log: "other", Node: "n9", StreamSeq: 1}, batch)
	require.NoError(t, err)
	require.Equal(t, 1, res.Events)
	require.Equal(t, 1, res.Ops)
	require.Equal(t, 2, res.Skipped)
	require.Equal(t, Received, b.state("i-1"))
	var v string
	require.NoError(t, b.log.ReadDB().Get(&v, `SELECT v FROM test_kv WHERE k = 'k'`))
	require.Equal(t, "v", v)

	for _, bad := range []string{
		`{"v":2,"from":0,"to":1,"items":[]}`,
		`{"v":1,"from":0,"to":1,"items":[{"pos":2,"op":"test.kv","payload":{}}]}`,
		`{"v":1,"from":0,"to":2,"items":[{"pos":2,"nonce":"n","state":"nope"}]}`,
		`{"v":1,"from":0,"to":2,"items":[{"pos":2,"nonce":"n","state":"received","op":"x","payload":{}}]}`,
		`{"v":1,"from":0,"to":2,"items":[],"extra":1}`,
	} {
		_, err := b.log.Import(ctx, ImportSource{Log: "other", StreamSeq: 2}, []byte(bad))
		require.Error(t, err, bad)
	}
	_, err = b.log.Import(ctx, ImportSource{Log: b.log.ID(), StreamSeq: 1}, batch)
	require.Error(t, err, "a log never imports itself")
}
