package web

import (
	"context"
	"time"

	"github.com/beamdir/beam/tracing"
)

// autoWindows are the windows the overview picks from when asked for
// hours=auto: the smallest that holds the log's intents of the last week,
// so a fresh server shows a few minutes in fine buckets, not one bar of a
// day.
var autoWindows = []float64{0.25, 1, 6, 24, 168}

// autoWindowHours picks the overview window from the age of the oldest
// intent of the last week; an empty log gets the shortest window.
func (d *Dashboard) autoWindowHours(ctx context.Context) (float64, error) {
	now := d.clock()
	longest := autoWindows[len(autoWindows)-1]
	oldest, ok, err := d.log.OldestIntentSince(ctx, now.Add(-time.Duration(longest*float64(time.Hour))))
	if err != nil || !ok {
		return autoWindows[0], err
	}
	age := now.Sub(oldest)
	for _, w := range autoWindows {
		if float64(age)*1.1 <= w*float64(time.Hour) {
			return w, nil
		}
	}
	return longest, nil
}

// ownerLatency is the latency of one owner's intents: directory intents
// complete in milliseconds, bus messages may wait minutes for retries, so
// the overview never mixes them in one percentile.
type ownerLatency struct {
	Count        int64  `json:"count"`
	P50LatencyMs *int64 `json:"p50LatencyMs"`
	P95LatencyMs *int64 `json:"p95LatencyMs"`
	lat          *sampler
}

// latencyByOwner maps an owner (directory, bus) to its latency.
type latencyByOwner map[tracing.Owner]*ownerLatency

func (l latencyByOwner) add(owner tracing.Owner, ms int64, capacity int) {
	if owner == "" {
		owner = tracing.OwnerDirectory
	}
	o := l[owner]
	if o == nil {
		o = &ownerLatency{lat: newSampler(capacity)}
		l[owner] = o
	}
	o.Count++
	o.lat.add(ms)
}

func (l latencyByOwner) finish() {
	for _, o := range l {
		p := o.lat.percentiles(0.5, 0.95)
		o.P50LatencyMs, o.P95LatencyMs = p[0], p[1]
	}
}
