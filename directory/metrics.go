package directory

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes counted in beam_intents_relayed_total.
const (
	outcomeAcked    = "acked"
	outcomeFailed   = "failed"
	outcomeAccepted = "accepted" // async acceptance: left delivered
	outcomeReplayed = "replayed" // cached result of a finished nonce
	outcomeRefused  = "refused"  // answered without a lifecycle (in progress, conflict, ...)
)

type metrics struct {
	sessions prometheus.Gauge
	relayed  *prometheus.CounterVec
	latency  prometheus.Histogram
	rejected *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "beam_ws_sessions",
			Help: "WebSocket sessions currently attached to the directory.",
		}),
		relayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_intents_relayed_total",
			Help: "Intents answered by the relay, by outcome (acked, failed, accepted, replayed, refused).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "beam_relay_seconds",
			Help:    "Time from receiving an intent to answering its sender.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_frames_rejected_total",
			Help: "Frames and messages refused before they were recorded, by error code.",
		}, []string{"code"}),
	}
	if reg == nil {
		return m, nil
	}
	// A second Directory on the same registerer (a restart in one process)
	// reuses the collectors already registered.
	var err error
	if m.sessions, err = register(reg, m.sessions); err != nil {
		return nil, err
	}
	if m.relayed, err = register(reg, m.relayed); err != nil {
		return nil, err
	}
	if m.latency, err = register(reg, m.latency); err != nil {
		return nil, err
	}
	if m.rejected, err = register(reg, m.rejected); err != nil {
		return nil, err
	}
	return m, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("register metrics: %w", err)
	}
	return c, nil
}
