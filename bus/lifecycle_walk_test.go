package bus

import (
	"math/rand/v2"
	"testing"

	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

// TestBusMessageLifecycleWalk: random steps of bus messages, appended
// through the log, leave only transitions of the bus table (Lifecycle) in
// the log, and a rebuild and a reopen give the intent_log and
// beam_messages rows the appender wrote.
func TestBusMessageLifecycleWalk(t *testing.T) {
	t.Parallel()
	lg, reopen := lifecycletest.OpenLog(t)
	seed := lifecycletest.Seed(t)
	retries := 0
	lifecycletest.Walk(t, lg, tracing.OwnerBus, "bus-", seed, 600, 40,
		func(rng *rand.Rand, nonce string, cur tracing.State) tracing.Event {
			ev := tracing.Event{Nonce: nonce, State: tracing.States[rng.IntN(len(tracing.States))], Transport: transportBus}
			if cur == "" {
				if rng.IntN(4) > 0 {
					ev.State = tracing.Received
				}
				ev.From, ev.To, ev.IntentType = "a@acme.beam.directory", "b@acme.beam.directory", "task.run"
				ev.Details.Owner = tracing.OwnerBus
				ev.Details.Bus = &tracing.BusMessage{MessageID: "msg-" + nonce, Payload: []byte(`{"n":1}`)}
			}
			switch ev.State {
			case tracing.Queued:
				retries++
				ev.Details.RetryCount = &retries
				ev.Details.NextRetryAt = int64(1_800_000_000_000 + retries)
			case tracing.Dispatched:
				ev.Details.LeaseOwner, ev.Details.LeaseExpiresAt = "poller", 1_800_000_000_000
			case tracing.Failed, tracing.DeadLetter:
				ev.Details.Error = "boom"
			}
			return ev
		}, reopen)
}
