package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/tracing"
)

// metrics are the bus's Prometheus metrics.
type metrics struct {
	attempts      *prometheus.CounterVec
	outcomes      *prometheus.CounterVec
	retries       prometheus.Counter
	deadLetters   prometheus.Counter
	requeues      prometheus.Counter
	leasesExpired prometheus.Counter
	latency       prometheus.Histogram
}

// depthCollector reports beam_bus_messages{state} from the log's message
// projection (tracing.Log.MessageCountsByState) at scrape time, so the
// gauge never drifts from it.
type depthCollector struct {
	b    *Bus
	desc *prometheus.Desc
}

func (c *depthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *depthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.b.log.MessageCountsByState(ctx, tracing.MessageQuery{})
	if err != nil {
		c.b.lg.Warn("bus metrics: count messages", "err", err)
		return
	}
	for _, s := range tracing.States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}

func newMetrics(reg prometheus.Registerer, b *Bus) (*metrics, error) {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_bus_attempts_total", Help: "Delivery attempts started by the message bus, by transport (ws, poll).",
		}, []string{"transport"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_bus_outcomes_total", Help: "Bus messages settled, by outcome (acked, failed, dead_letter, accepted).",
		}, []string{"outcome"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_bus_retries_total", Help: "Failed bus delivery attempts rescheduled for a retry.",
		}),
		deadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_bus_dead_letters_total", Help: "Bus messages moved to dead_letter.",
		}),
		requeues: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_bus_requeues_total", Help: "Operator requeues of dead-lettered or failed bus messages.",
		}),
		leasesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_bus_leases_expired_total", Help: "Poll leases that expired without an ack.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "beam_bus_delivery_latency_seconds", Help: "Time from acceptance of a bus message to its WebSocket delivery.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30, 120, 600, 3600},
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.attempts, m.outcomes, m.retries, m.deadLetters, m.requeues, m.leasesExpired, m.latency,
		&depthCollector{b: b, desc: prometheus.NewDesc("beam_bus_messages", "Bus messages by lifecycle state (queue depth per state).", []string{"state"}, nil)},
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register bus metrics: %w", err)
		}
	}
	return m, nil
}
