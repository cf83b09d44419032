package tracing

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of beam_log_rejected_total.
const (
	rejectTransition = "transition"
	rejectInvalid    = "invalid"
	rejectFunc       = "func"
	rejectCanceled   = "canceled"
	rejectClosed     = "closed"
	rejectError      = "error"
)

type metrics struct {
	appended prometheus.Counter
	append   prometheus.Histogram
	batch    prometheus.Histogram
	commit   prometheus.Histogram
	intents  *prometheus.GaugeVec
	rejected *prometheus.CounterVec
	pending  prometheus.Gauge
	// rowsInserted and rowsUpdated count intent_log rows written.
	rowsInserted, rowsUpdated prometheus.Counter
	gauges                    [8]prometheus.Gauge // per state, in States order
	// shipTook and shipFailed are the shipping's (replicate.go),
	// registered in cluster mode only.
	shipTook   prometheus.Histogram
	shipFailed prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, shipping bool) (*metrics, error) {
	m := &metrics{
		appended: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_log_events_appended_total",
			Help: "Events committed to the log.",
		}),
		append: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "beam_log_append_seconds",
			Help:    "Duration of one Append or Do call, from submission to commit.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "beam_log_batch_events",
			Help:    "Events committed per group-commit transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "beam_log_commit_seconds",
			Help:    "Duration of one group-commit transaction, from BEGIN to the end of COMMIT.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		intents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "beam_intents",
			Help: "Intents per current lifecycle state.",
		}, []string{"state"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_log_rejected_total",
			Help: "Append and Do calls rejected, by reason.",
		}, []string{"reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "beam_log_projection_pending_rows",
			Help: "Intents whose projection rows wait in memory to be written behind their events.",
		}),
		shipTook: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "beam_log_ship_seconds",
			Help:    "Duration of one call shipping committed log batches to replicated storage (cluster mode).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		shipFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_log_ship_failures_total",
			Help: "Calls shipping log batches that replicated storage refused (their appenders got an error).",
		}),
	}
	written := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "beam_log_projection_rows_written_total",
		Help: "intent_log rows written behind the log: inserted (an intent's first row) or updated (a row written before).",
	}, []string{"how"})
	m.rowsInserted, m.rowsUpdated = written.WithLabelValues("insert"), written.WithLabelValues("update")
	for i, s := range States {
		m.gauges[i] = m.intents.WithLabelValues(string(s))
	}
	for _, r := range []string{rejectTransition, rejectInvalid, rejectFunc, rejectCanceled, rejectClosed, rejectError} {
		m.rejected.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.appended, m.append, m.batch, m.commit, m.intents, m.rejected, m.pending, written}
	if shipping {
		cs = append(cs, m.shipTook, m.shipFailed)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("register log metrics: %w (one Log per registry)", err)
			}
			return nil, fmt.Errorf("register log metrics: %w", err)
		}
	}
	return m, nil
}

// stateIndex returns the position of s in States, or -1.
func stateIndex(s State) int {
	switch s {
	case Received:
		return 0
	case Validated:
		return 1
	case Queued:
		return 2
	case Dispatched:
		return 3
	case Delivered:
		return 4
	case Acked:
		return 5
	case Failed:
		return 6
	case DeadLetter:
		return 7
	}
	return -1
}
