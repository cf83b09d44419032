package tracing

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

var (
	flagSeed   = flag.Uint64("tracing.seed", 1, "seed of the randomized projection test")
	flagEvents = flag.Int("tracing.events", 3000, "events appended by the randomized projection test")
)

var testAgents = []string{"alice@acme.beam.directory", "bob@acme.beam.directory", "carol@globex.beam.directory",
	"dave@initech.beam.directory", "erin@acme.beam.directory"}

// genLifecycle returns a valid random event sequence for one nonce: a
// weighted random walk over the lifecycle with the details each step
// carries in the real system (directory paths, async acceptance that stays
// delivered, retries, bus messages with retry schedules and leases, dead
// letters and requeues, self-annotations, late results).
func genLifecycle(rng *rand.Rand, i int) []Event {
	bus := rng.IntN(10) < 3
	nonce := fmt.Sprintf("n%05d-%08x", i, rng.Uint32())
	first := Event{
		Nonce: nonce, State: Received,
		From: testAgents[rng.IntN(len(testAgents))], To: testAgents[rng.IntN(len(testAgents))],
		IntentType: []string{"task.run", "agent.ping", "invoice.review"}[rng.IntN(3)],
		Transport:  []string{"ws", "http", "federation", "direct-http"}[rng.IntN(4)],
		Details: Details{
			Frame:           json.RawMessage(fmt.Sprintf(`{"nonce": %q, "n": %d}`, nonce, rng.IntN(1000))),
			ClientTimestamp: time.Unix(1767225600+int64(rng.IntN(1000)), 0).UTC().Format(time.RFC3339),
		},
	}
	if rng.IntN(4) > 0 {
		first.Details.Owner = OwnerDirectory
	}
	if bus {
		first.Transport = "bus"
		first.Details.Owner = OwnerBus
		bm := &BusMessage{MessageID: "msg-" + nonce}
		if rng.IntN(2) == 0 {
			bm.Payload = json.RawMessage(fmt.Sprintf(`{"amount":%d}`, rng.IntN(100)))
		}
		bm.Priority = rng.IntN(3)
		if rng.IntN(2) == 0 {
			bm.MaxRetries = 1 + rng.IntN(8)
		}
		if rng.IntN(2) == 0 {
			bm.TraceID = fmt.Sprintf("trace-%d", rng.IntN(100))
		}
		if rng.IntN(3) == 0 {
			bm.Metadata = json.RawMessage(`{"source":"test"}`)
		}
		first.Details.Bus = bm
	}
	if rng.IntN(10) == 0 {
		first.At = time.UnixMicro(1767225600000000 + rng.Int64N(1e12)).UTC()
	}
	events := []Event{first}
	cur := Received
	attempt, retries := 0, 0
	steps := 1 + rng.IntN(14)
	weight := map[State]int{Received: 1, Validated: 8, Queued: 4, Dispatched: 8, Delivered: 8, Acked: 6, Failed: 4, DeadLetter: 2}
	for len(events) < steps {
		if cur == Acked || (cur.Terminal() && rng.IntN(3) == 0) {
			break
		}
		if cur == Delivered && rng.IntN(6) == 0 {
			break // async acceptance: stays delivered
		}
		var opts []State
		total := 0
		for _, s := range States {
			if CanTransition(cur, s) {
				w := weight[s]
				if s == cur {
					w = 1
				}
				opts = append(opts, s)
				total += w
			}
		}
		pick := rng.IntN(total)
		var next State
		for _, s := range opts {
			w := weight[s]
			if s == cur {
				w = 1
			}
			if pick < w {
				next = s
				break
			}
			pick -= w
		}
		e := Event{Nonce: nonce, State: next}
		d := &e.Details
		self := next == cur
		switch next {
		case Received:
			d.Extra = map[string]any{"hop": rng.IntN(3)}
		case Validated:
			if rng.IntN(2) == 0 {
				e.Transport = "ws"
			}
		case Queued:
			if rng.IntN(2) == 0 {
				d.ErrorCode = "DELIVERY_FAILED"
				d.Error = "recipient offline"
			}
			if bus {
				retries++
				d.NextRetryAt = 1767225600000 + rng.Int64N(1e6)
				d.RetryCount = &retries
			}
		case Dispatched:
			if !self {
				attempt++
				e.Attempt = attempt
			}
			if rng.IntN(2) == 0 {
				d.TimeoutMs = int64(1000 * (1 + rng.IntN(60)))
			}
			if bus && rng.IntN(2) == 0 {
				d.LeaseOwner = fmt.Sprintf("worker-%d", rng.IntN(4))
				d.LeaseExpiresAt = 1767225600000 + rng.Int64N(1e6)
			}
			if self && rng.IntN(2) == 0 {
				d.Extra = map[string]any{"hopCount": 2, "peer": "globex"}
			}
		case Delivered:
			if rng.IntN(3) == 0 {
				d.Result = json.RawMessage(`{"accepted":true,"acknowledgement":"accepted","terminal":false}`)
			}
		case Acked:
			if rng.IntN(2) == 0 {
				l := rng.Int64N(5000)
				d.LatencyMs = &l
			}
			d.Result = json.RawMessage(fmt.Sprintf(`{"success":true,"nonce":%q}`, nonce))
			if bus && rng.IntN(2) == 0 {
				d.Response = json.RawMessage(`{"ok":true}`)
			}
		case Failed:
			d.ErrorCode = []string{"TIMEOUT", "AGENT_OFFLINE", "INTENT_HANDLER_ERROR"}[rng.IntN(3)]
			d.Error = "failed: " + d.ErrorCode
			d.Retryable = rng.IntN(2) == 0
			if rng.IntN(2) == 0 {
				d.Result = json.RawMessage(fmt.Sprintf(`{"success":false,"errorCode":%q}`, d.ErrorCode))
			}
			if self {
				d.Extra = map[string]any{"lateResult": true}
			}
			if bus && rng.IntN(3) == 0 {
				d.Response = json.RawMessage(`{"ok":false}`)
			}
		case DeadLetter:
			d.ErrorCode = "RETRIES_EXHAUSTED"
			d.Error = "gave up"
			if bus {
				d.RetryCount = &retries
			}
		}
		if rng.IntN(15) == 0 {
			e.At = time.UnixMicro(1767225600000000 + rng.Int64N(1e12)).UTC()
		}
		events = append(events, e)
		cur = next
	}
	return events
}

type projSnapshot struct {
	Intents  []IntentRow
	Messages []MessageRow
}

func snapshotProjections(t *testing.T, l *Log) projSnapshot {
	t.Helper()
	var s projSnapshot
	require.NoError(t, l.Sync(context.Background()))
	require.NoError(t, l.ReadDB().Select(&s.Intents, `SELECT * FROM intent_log ORDER BY nonce`))
	require.NoError(t, l.ReadDB().Select(&s.Messages, `SELECT * FROM beam_messages ORDER BY nonce`))
	return s
}

// TestProjectionEqualsRebuild appends random valid lifecycles concurrently
// in random chunks, checks the projections against a pure fold of the
// committed events, rebuilds them from the log and requires identical rows.
func TestProjectionEqualsRebuild(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxBatch = 256 })
	ctx := context.Background()
	seed := *flagSeed
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var scripts [][]Event
	total := 0
	for total < *flagEvents {
		s := genLifecycle(rng, len(scripts))
		scripts = append(scripts, s)
		total += len(s)
	}
	t.Logf("seed %d: %d nonces, %d events", seed, len(scripts), total)

	const workers = 8
	committed := make([][]Event, len(scripts))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wrng := rand.New(rand.NewPCG(seed, uint64(w)+1))
			var mine []int
			for i := w; i < len(scripts); i += workers {
				mine = append(mine, i)
			}
			pos := make(map[int]int)
			for len(mine) > 0 {
				// One call: a chunk of one nonce, sometimes followed by a chunk
				// of another of this worker's nonces.
				var call []Event
				var owners []int
				for k := 0; k < 1+wrng.IntN(2) && len(mine) > 0; k++ {
					j := wrng.IntN(len(mine))
					si := mine[j]
					n := min(1+wrng.IntN(3), len(scripts[si])-pos[si])
					if len(owners) > 0 && owners[len(owners)-1] == si {
						continue
					}
					for _, e := range scripts[si][pos[si] : pos[si]+n] {
						call = append(call, e)
						owners = append(owners, si)
					}
					pos[si] += n
					if pos[si] == len(scripts[si]) {
						mine = append(mine[:j], mine[j+1:]...)
					}
				}
				out, err := b.log.Append(ctx, call...)
				if err != nil {
					errs <- fmt.Errorf("append %v: %w", call[0].Nonce, err)
					return
				}
				for k, e := range out {
					committed[owners[k]] = append(committed[owners[k]], e)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(total), b.log.LastSeq())

	before := snapshotProjections(t, b.log)
	require.Len(t, before.Intents, len(scripts))

	// Pure fold of the committed events equals what the appender wrote.
	wantI := make(map[string]IntentRow)
	wantM := make(map[string]MessageRow)
	buses := 0
	for _, evs := range committed {
		var r IntentRow
		var m MessageRow
		for k, e := range evs {
			if k > 0 {
				require.Greater(t, e.Seq, evs[k-1].Seq)
			}
			r.Apply(e)
			m.Apply(e)
		}
		wantI[r.Nonce] = r
		if evs[0].Details.Bus != nil {
			wantM[r.Nonce] = m
			buses++
		}
	}
	for _, row := range before.Intents {
		require.Equal(t, wantI[row.Nonce], row)
	}
	require.Len(t, before.Messages, buses)
	for _, row := range before.Messages {
		require.Equal(t, wantM[row.Nonce], row)
	}

	// The fold of the events as read back from the log gives the same rows.
	for _, i := range []int{0, len(scripts) / 2, len(scripts) - 1} {
		tr, err := b.log.Trace(ctx, scripts[i][0].Nonce)
		require.NoError(t, err)
		var r IntentRow
		for _, e := range tr {
			r.Apply(e)
		}
		require.Equal(t, wantI[r.Nonce], r)
	}

	counts, err := b.log.CountByState(ctx)
	require.NoError(t, err)
	for _, s := range States {
		require.Equal(t, float64(counts[s]), b.metric("beam_intents", "state", string(s)), s)
	}

	stats, err := b.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(total), stats.Events)
	require.Equal(t, int64(len(scripts)), stats.Intents)
	require.Equal(t, int64(buses), stats.Messages)
	after := snapshotProjections(t, b.log)
	require.Equal(t, len(before.Intents), len(after.Intents))
	for i := range before.Intents {
		require.Equal(t, before.Intents[i], after.Intents[i])
	}
	require.Equal(t, before.Messages, after.Messages)
	for _, s := range States {
		require.Equal(t, float64(counts[s]), b.metric("beam_intents", "state", string(s)), s)
	}

	// The cache holds exactly the non-terminal rows, as stored.
	checkCache := func() {
		nt, err := b.log.NonTerminal(ctx)
		require.NoError(t, err)
		require.Len(t, b.log.w.cache, len(nt))
		for _, row := range nt {
			e := b.log.w.cache[row.Nonce]
			require.NotNil(t, e, row.Nonce)
			require.Equal(t, row, e.row)
			if m, ok := wantM[row.Nonce]; ok {
				require.NotNil(t, e.msg)
				require.Equal(t, m, *e.msg)
			} else {
				require.Nil(t, e.msg)
			}
		}
	}
	checkCache()
	b.reopen()
	checkCache()
	require.Equal(t, before, snapshotProjections(t, b.log))
}

// TestRebuildAfterManualDamage shows that Rebuild repairs projections that
// no longer match the log.
func TestRebuildRepairs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := received("m")
	m.Details = Details{Owner: OwnerBus, Bus: &BusMessage{MessageID: "id-m"}}
	b.append(m, ev("m", Dispatched), ev("m", Delivered))
	b.append(received("d"), ev("d", Failed))
	before := snapshotProjections(t, b.log)
	_, err := b.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`UPDATE intent_log SET status = 'acked'; DELETE FROM beam_messages`)
		return err
	})
	require.NoError(t, err)
	require.NotEqual(t, before, snapshotProjections(t, b.log))
	stats, err := b.log.Rebuild(ctx)
	require.NoError(t, err)
	require.Equal(t, RebuildStats{Events: 5, Intents: 2, Messages: 1, Duration: stats.Duration}, stats)
	require.Equal(t, before, snapshotProjections(t, b.log))
	// Appends continue from the rebuilt state.
	b.append(ev("m", Acked), ev("d", Queued))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.log.Rebuild(cctx)
	require.ErrorIs(t, err, context.Canceled)
}
