package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/beamdir/beam/tracing"
)

// maxSeedEvents bounds seedLog.
const maxSeedEvents = 50_000_000

// SeedOptions configure seedLog.
type SeedOptions struct {
	// Events is how many events to append.
	Events int
	// InFlightEvery leaves every n-th intent non-terminal (dispatched, as a
	// crash would leave it), so a restart has intents to recover; 0 leaves
	// none.
	InFlightEvery int
	// Clock stamps the events; nil means time.Now.
	Clock func() time.Time
}

// seedStats tells what seedLog wrote.
type seedStats struct {
	// Events and Intents are how many were written; InFlight is how many
	// intents were left non-terminal.
	Events, Intents, InFlight int
	// Took is how long it took.
	Took time.Duration
}

// seedFrom and seedTo are the agents of seeded intents.
const (
	seedFrom = "seed-a@seed.beam.directory"
	seedTo   = "seed-b@seed.beam.directory"
)

// seedEvent is the step-th event (0…4) of a typical relayed intent.
func seedEvent(nonce string, step int, at time.Time) tracing.Event {
	switch step {
	case 0:
		return tracing.Event{Nonce: nonce, State: tracing.Received, At: at, From: seedFrom, To: seedTo,
			IntentType: benchIntent, Transport: "ws", Details: tracing.Details{Owner: tracing.OwnerDirectory,
				ClientTimestamp: "2026-01-02T03:04:05.000Z",
				Frame: json.RawMessage(`{"v":"1","intent":"bench.echo","from":"` + seedFrom + `","to":"` + seedTo +
					`","payload":{"task":"bench","fill":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},"nonce":"` + nonce +
					`","timestamp":"2026-01-02T03:04:05.000Z","signature":"c2lnbmF0dXJlIG9mIGEgc2VlZGVkIGludGVudCwgbm90IGEgcmVhbCBvbmUgLSBzZWVkIGRhdGEgb25seQ=="}`)}}
	case 1:
		return tracing.Event{Nonce: nonce, State: tracing.Validated, At: at}
	case 2:
		return tracing.Event{Nonce: nonce, State: tracing.Dispatched, At: at, Transport: "ws", Attempt: 1,
			Details: tracing.Details{TimeoutMs: 30000}}
	case 3:
		return tracing.Event{Nonce: nonce, State: tracing.Delivered, At: at}
	default:
		lat := int64(3)
		return tracing.Event{Nonce: nonce, State: tracing.Acked, At: at, Details: tracing.Details{LatencyMs: &lat,
			Result: json.RawMessage(`{"v":"1","success":true,"nonce":"` + nonce + `","timestamp":"2026-01-02T03:04:05.003Z","payload":{"ok":true}}`)}}
	}
}

// seedLog appends opts.Events events of relayed intents (five events each:
// received … acked) to the log in dataDir/beam.db, the file beam serve
// opens, with synchronous=OFF for speed. It must run while no server uses
// the directory.
func seedLog(ctx context.Context, dataDir string, opts SeedOptions) (seedStats, error) {
	if opts.Events <= 0 || opts.Events > maxSeedEvents {
		return seedStats{}, fmt.Errorf("seed log: events %d out of range 1..%d", opts.Events, maxSeedEvents)
	}
	if opts.InFlightEvery < 0 {
		return seedStats{}, errors.New("seed log: negative in-flight interval")
	}
	clock := opts.Clock
	if clock == nil {
		clock = time.Now
	}
	began := time.Now()
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(dataDir, "beam.db"), Synchronous: "OFF", Clock: clock})
	if err != nil {
		return seedStats{}, fmt.Errorf("seed log: %w", err)
	}
	st := seedStats{}
	const batchSize = 2000
	batch := make([]tracing.Event, 0, batchSize+5)
	for st.Events < opts.Events {
		batch = batch[:0]
		at := clock()
		for len(batch) < batchSize && st.Events < opts.Events {
			st.Intents++
			nonce := fmt.Sprintf("seed-%010d", st.Intents)
			steps := 5
			if opts.InFlightEvery > 0 && st.Intents%opts.InFlightEvery == 0 {
				steps = 3
				st.InFlight++
			}
			for s := 0; s < steps && st.Events < opts.Events; s++ {
				batch = append(batch, seedEvent(nonce, s, at))
				st.Events++
			}
			if steps == 5 && st.Events == opts.Events && len(batch) > 0 && batch[len(batch)-1].State != tracing.Acked {
				st.InFlight++ // the last intent was cut short
			}
		}
		if _, err := lg.Append(ctx, batch...); err != nil {
			_ = lg.Close()
			return st, fmt.Errorf("seed log: append: %w", err)
		}
	}
	if err := lg.Close(); err != nil {
		return st, fmt.Errorf("seed log: close: %w", err)
	}
	st.Took = time.Since(began)
	return st, nil
}

// RestartSummary is the outcome of MeasureRestart. Its JSON names are
// stable.
type RestartSummary struct {
	// Events, Intents and InFlight describe the seeded log.
	Events   int `json:"restart_events"`
	Intents  int `json:"restart_intents"`
	InFlight int `json:"restart_in_flight"`
	// SeedS is how long seeding took.
	SeedS float64 `json:"seed_s"`
	// FirstStartS is the first start on the seeded log (it also creates the
	// directory's own tables); RestartS the start after a clean stop. Both
	// from exec to the first /health 200.
	FirstStartS float64 `json:"first_start_s"`
	RestartS    float64 `json:"restart_s"`
	// RestartRSSMB is the server's peak RSS during the restart.
	RestartRSSMB *float64 `json:"restart_rss_mb"`
}

// MeasureRestart seeds a log of seed.Events events in opts.DataDir, then
// starts the server on it, stops it, starts it again, and reports how long
// each start took until /health answered 200.
func MeasureRestart(ctx context.Context, opts ServerOptions, seed SeedOptions) (*RestartSummary, error) {
	st, err := seedLog(ctx, opts.DataDir, seed)
	if err != nil {
		return nil, err
	}
	sum := &RestartSummary{Events: st.Events, Intents: st.Intents, InFlight: st.InFlight, SeedS: round3(st.Took.Seconds())}
	for i := range 2 {
		p, err := StartServer(ctx, opts)
		if err != nil {
			return sum, fmt.Errorf("start %d: %w", i+1, err)
		}
		if i == 0 {
			sum.FirstStartS = round3(p.Ready.Seconds())
		} else {
			sum.RestartS = round3(p.Ready.Seconds())
			if s, err := readProc(p.PID); err == nil {
				v := mb(s.HWM)
				sum.RestartRSSMB = &v
			}
		}
		if err := p.Stop(ctx); err != nil {
			return sum, fmt.Errorf("stop %d: %w", i+1, err)
		}
	}
	return sum, nil
}
