package federation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	peers           prometheus.Gauge
	lastContact     *prometheus.GaugeVec
	enqueued        *prometheus.CounterVec
	published       *prometheus.CounterVec
	publishFailures *prometheus.CounterVec
	retried         *prometheus.CounterVec
	dead            *prometheus.CounterVec
	reaped          prometheus.Counter
	received        *prometheus.CounterVec
	rejected        *prometheus.CounterVec
	keyCache        *prometheus.CounterVec
	publishSeconds  prometheus.Histogram

	outboxCounts func(context.Context) (map[OutboxState]int64, error)
}

// outboxCollector reports the outbox rows by state when scraped.
type outboxCollector struct {
	m    *metrics
	desc *prometheus.Desc
}

func (c outboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c outboxCollector) Collect(ch chan<- prometheus.Metric) {
	if c.m.outboxCounts == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.m.outboxCounts(ctx)
	if err != nil {
		return
	}
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(s))
	}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "beam_federation_peers", Help: "Pinned peer directories.",
		}),
		lastContact: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "beam_federation_peer_last_contact_seconds", Help: "Unix time of the last verified message from each peer.",
		}, []string{"peer"}),
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_outbox_enqueued_total", Help: "Outbox rows written, by peer.",
		}, []string{"peer"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_published_total", Help: "Outbox rows finalized PUBLISHED after the peer confirmed, by peer and kind.",
		}, []string{"peer", "kind"}),
		publishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_publish_failures_total", Help: "Failed publish attempts, by peer and reason (transport, reply, remote_busy, remote_retryable).",
		}, []string{"peer", "reason"}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_outbox_retries_total", Help: "Outbox rows returned to PENDING after a failed attempt, by peer.",
		}, []string{"peer"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_outbox_dead_total", Help: "Outbox rows moved to DEAD, by peer.",
		}, []string{"peer"}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "beam_federation_outbox_reaped_total", Help: "Expired claims returned to PENDING.",
		}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_received_total", Help: "Verified federation requests received, by peer and kind.",
		}, []string{"peer", "kind"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_rejected_total", Help: "Federation messages and connections refused, by reason.",
		}, []string{"reason"}),
		keyCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beam_federation_key_cache_total", Help: "Remote agent key lookups, by result (hit, miss).",
		}, []string{"result"}),
		publishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "beam_federation_publish_seconds", Help: "Time from publishing an outbox row to the peer's reply.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
	}
	for _, r := range []string{rejectMalformed, rejectUnpinned, rejectBadSignature, rejectStale, rejectReplay,
		rejectMisaddressed, rejectPermission, rejectHops, rejectLoop, rejectSender} {
		m.rejected.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.peers, m.lastContact, m.enqueued, m.published, m.publishFailures,
		m.retried, m.dead, m.reaped, m.received, m.rejected, m.keyCache, m.publishSeconds,
		outboxCollector{m: m, desc: prometheus.NewDesc("beam_federation_outbox_rows", "Outbox rows by state.", []string{"state"}, nil)}} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return nil, fmt.Errorf("register federation metrics: %w", err)
		}
	}
	return m, nil
}

// natsLogger forwards the embedded server's log to slog and counts
// authorization and permission violations.
type natsLogger struct {
	lg *slog.Logger
	m  *metrics
}

func (l *natsLogger) count(msg string) {
	switch {
	case strings.Contains(msg, "Publish Violation"), strings.Contains(msg, "Subscription Violation"):
		l.m.rejected.WithLabelValues(rejectPermission).Inc()
	case strings.Contains(msg, "Authorization Violation"):
		l.m.rejected.WithLabelValues(rejectUnpinned).Inc()
	}
}

func (l *natsLogger) Noticef(format string, v ...any) { l.lg.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.warn(fmt.Sprintf(format, v...)) }

// warn logs a warning or error of the server; those a forming cluster
// prints as a matter of course are debug detail (the cluster node logs
// its own "waiting for the cluster to form" while it lasts).
func (l *natsLogger) warn(msg string) {
	l.count(msg)
	for _, p := range formingNoise {
		if strings.Contains(msg, p) {
			l.lg.Debug(msg)
			return
		}
	}
	l.lg.Warn(msg)
}

// formingNoise are the messages of the embedded server that every node of
// a cluster logs while the cluster forms or a node restarts.
var formingNoise = []string{
	"Error trying to connect to route",
	"Waiting for routing to be established",
	"JetStream has not established contact with a meta leader",
	"Metalayer blocking snapshot",
	"system account not setup",
}

func (l *natsLogger) Fatalf(format string, v ...any) { l.lg.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any) { l.warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any) { l.lg.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Tracef(format string, v ...any) {}
