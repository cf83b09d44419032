package mesh

import "github.com/prometheus/client_golang/prometheus"

// metrics are the pipeline's Prometheus metrics.
type metrics struct {
	created    prometheus.Counter
	hops       prometheus.Counter
	retries    prometheus.Counter
	stale      prometheus.Counter
	flyDropped prometheus.Counter
	lagged     prometheus.Counter
	finished   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "beam", Subsystem: "mesh", Name: name, Help: help})
	}
	m := &metrics{
		created:    c("envelopes_created_total", "Envelopes created through the gateway."),
		hops:       c("hop_attempts_total", "Hop delivery attempts started."),
		retries:    c("retries_total", "Hop attempts scheduled again by a retry policy."),
		stale:      c("stale_updates_total", "Outcomes and status updates dropped because the envelope had moved on."),
		flyDropped: c("fly_dropped_total", "FLY events dropped because a subscriber's buffer was full."),
		lagged:     c("subscribers_lagged_total", "Event streams closed because a subscriber fell behind on status events."),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "beam", Subsystem: "mesh",
			Name: "envelopes_finished_total", Help: "Envelopes that reached a terminal status, by status."}, []string{"status"}),
	}
	if reg != nil {
		reg.MustRegister(m.created, m.hops, m.retries, m.stale, m.flyDropped, m.lagged, m.finished)
	}
	return m
}
