package web

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// overviewSummary is the summary block of GET /observability/overview.
// SuccessRate is acked / (acked + failed + dead_letter) over the window, in
// [0, 1], null when nothing completed.
type overviewSummary struct {
	TotalAgents          int      `json:"totalAgents"`
	LiveAgents           int      `json:"liveAgents"`
	ConnectedAgents      int      `json:"connectedAgents"`
	StaleAgents          int      `json:"staleAgents"`
	TotalIntents         int64    `json:"totalIntents"`
	SuccessCount         int64    `json:"successCount"`
	ErrorCount           int64    `json:"errorCount"`
	InFlightCount        int64    `json:"inFlightCount"`
	ByState              byState  `json:"byState"`
	SuccessRate          *float64 `json:"successRate"`
	AvgLatencyMs         *float64 `json:"avgLatencyMs"`
	P50LatencyMs         *int64   `json:"p50LatencyMs"`
	P95LatencyMs         *int64   `json:"p95LatencyMs"`
	LatencySampled       bool     `json:"latencySampled,omitempty"`
	ThroughputPerMin     float64  `json:"throughputPerMin"`
	InFlightOlderThan15m int64    `json:"inFlightOlderThan15m"`
	QueueDepth           int64    `json:"queueDepth"`
	DeadLetters          int64    `json:"deadLetters"`
	// LatencyByOwner splits the latency by who drives the intent.
	LatencyByOwner latencyByOwner `json:"latencyByOwner"`
}

type byState map[tracing.State]int64

type timelineBucket struct {
	BucketStart  string  `json:"bucketStart"`
	Total        int64   `json:"total"`
	Success      int64   `json:"success"`
	Error        int64   `json:"error"`
	InFlight     int64   `json:"inFlight"`
	P50LatencyMs *int64  `json:"p50LatencyMs"`
	P95LatencyMs *int64  `json:"p95LatencyMs"`
	Throughput   float64 `json:"throughput"` // intents per minute
	// LatencyByOwner splits the bucket's latency by owner.
	LatencyByOwner latencyByOwner `json:"latencyByOwner"`
	lat            *sampler
}

type topIntent struct {
	IntentType   string   `json:"intentType"`
	Count        int64    `json:"count"`
	Success      int64    `json:"success"`
	Error        int64    `json:"error"`
	AvgLatencyMs *float64 `json:"avgLatencyMs"`
	latSum       int64
	latN         int64
}

type topError struct {
	ErrorCode  string `json:"errorCode"`
	Count      int64  `json:"count"`
	LastSeenAt string `json:"lastSeenAt"`
	lastUs     int64
}

type alert struct {
	ID        string  `json:"id"`
	Severity  string  `json:"severity"`
	Title     string  `json:"title"`
	Message   string  `json:"message"`
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	Unit      string  `json:"valueUnit"`
}

type federationCard struct {
	Configured bool   `json:"configured"`
	Status     any    `json:"status,omitempty"`
	Error      string `json:"error,omitempty"`
	Message    string `json:"message,omitempty"`
}

type overviewResponse struct {
	WindowHours   float64          `json:"windowHours"`
	AutoWindow    bool             `json:"autoWindow,omitempty"`
	GeneratedAt   string           `json:"generatedAt"`
	BucketSeconds int64            `json:"bucketSeconds"`
	Summary       overviewSummary  `json:"summary"`
	Timeline      []timelineBucket `json:"timeline"`
	TopIntents    []*topIntent     `json:"topIntents"`
	TopErrors     []*topError      `json:"topErrors"`
	Alerts        []alert          `json:"alerts"`
	Federation    federationCard   `json:"federation"`
	LastSeq       int64            `json:"lastSeq"`
}

const (
	maxSample       = 20_000
	maxBucketSample = 2_000
	topN            = 8
)

func (d *Dashboard) handleOverview(w http.ResponseWriter, r *http.Request, _ principal) error {
	var hours float64
	var err error
	auto := r.URL.Query().Get("hours") == "auto"
	if auto {
		if hours, err = d.autoWindowHours(r.Context()); err != nil {
			return httpjson.Internal("overview failed", err)
		}
	} else if hours, err = hoursParam(r.URL.Query(), defaultWindowHours); err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
	}
	resp, err := d.overview(r.Context(), hours)
	if err != nil {
		return httpjson.Internal("overview failed", err)
	}
	resp.AutoWindow = auto
	httpjson.Write(w, http.StatusOK, resp)
	return nil
}

func (d *Dashboard) overview(ctx context.Context, hours float64) (*overviewResponse, error) {
	now := d.clock().UTC()
	window := time.Duration(hours * float64(time.Hour))
	start := now.Add(-window)
	a := newOverviewAgg(start, now, bucketSize(window))
	a.resp.WindowHours, a.resp.GeneratedAt, a.resp.LastSeq = hours, isoTime(now), d.log.LastSeq()
	err := d.log.EachIntent(ctx, tracing.IntentQuery{Since: start, Until: now}, func(row *tracing.IntentRow) error {
		a.add(row)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read intents: %w", err)
	}
	a.finish(window)
	resp := a.resp
	if err := d.fillCounts(ctx, now, &resp.Summary); err != nil {
		return nil, err
	}
	resp.Alerts = alertsFor(&resp.Summary)
	resp.Federation = d.federationCard(ctx)
	return resp, nil
}

// overviewAgg folds the window's intents into the overview: the summary,
// the timeline buckets and the per-type and per-error-code groups.
type overviewAgg struct {
	resp         *overviewResponse
	first        time.Time
	size         time.Duration
	all          *sampler
	latSum, latN int64
	intents      map[string]*topIntent
	codes        map[string]*topError
}

func newOverviewAgg(start, now time.Time, size time.Duration) *overviewAgg {
	first := start.Truncate(size)
	a := &overviewAgg{
		resp: &overviewResponse{
			BucketSeconds: int64(size / time.Second),
			TopIntents:    []*topIntent{},
			TopErrors:     []*topError{},
			Alerts:        []alert{},
		},
		first: first, size: size, all: newSampler(maxSample),
		intents: map[string]*topIntent{}, codes: map[string]*topError{},
	}
	a.resp.Summary.ByState = byState{}
	a.resp.Summary.LatencyByOwner = latencyByOwner{}
	for t := first; !t.After(now); t = t.Add(size) {
		a.resp.Timeline = append(a.resp.Timeline, timelineBucket{BucketStart: isoTime(t), lat: newSampler(maxBucketSample), LatencyByOwner: latencyByOwner{}})
	}
	return a
}

// add counts one intent of the window.
func (a *overviewAgg) add(row *tracing.IntentRow) {
	sum := &a.resp.Summary
	b := row.Status.Bucket()
	sum.TotalIntents++
	sum.ByState[row.Status]++
	var tb *timelineBucket
	if idx := int(time.UnixMicro(row.RequestedAt).Sub(a.first) / a.size); idx >= 0 && idx < len(a.resp.Timeline) {
		tb = &a.resp.Timeline[idx]
		tb.Total++
	}
	switch b {
	case tracing.BucketSuccess:
		sum.SuccessCount++
		if tb != nil {
			tb.Success++
		}
	case tracing.BucketError:
		sum.ErrorCount++
		if tb != nil {
			tb.Error++
		}
	default:
		sum.InFlightCount++
		if tb != nil {
			tb.InFlight++
		}
	}
	ti := a.intents[row.IntentType]
	if ti == nil && len(a.intents) < maxGroupKeys {
		ti = &topIntent{IntentType: row.IntentType}
		a.intents[row.IntentType] = ti
	}
	if ti != nil {
		ti.Count++
		switch b {
		case tracing.BucketSuccess:
			ti.Success++
		case tracing.BucketError:
			ti.Error++
		}
	}
	if lat := row.RoundTripLatencyMs; lat != nil && *lat >= 0 {
		a.all.add(*lat)
		a.latSum += *lat
		a.latN++
		sum.LatencyByOwner.add(row.Owner, *lat, maxSample)
		if tb != nil {
			tb.lat.add(*lat)
			tb.LatencyByOwner.add(row.Owner, *lat, maxBucketSample)
		}
		if ti != nil {
			ti.latSum += *lat
			ti.latN++
		}
	}
	if b == tracing.BucketError && row.ErrorCode != "" {
		te := a.codes[row.ErrorCode]
		if te == nil && len(a.codes) < maxGroupKeys {
			te = &topError{ErrorCode: row.ErrorCode}
			a.codes[row.ErrorCode] = te
		}
		if te != nil {
			te.Count++
			te.lastUs = max(te.lastUs, row.RequestedAt)
		}
	}
}

// finish derives rates, averages and percentiles and ranks the groups.
func (a *overviewAgg) finish(window time.Duration) {
	resp, sum := a.resp, &a.resp.Summary
	if done := sum.SuccessCount + sum.ErrorCount; done > 0 {
		rate := float64(sum.SuccessCount) / float64(done)
		sum.SuccessRate = &rate
	}
	if a.latN > 0 {
		avg := float64(a.latSum) / float64(a.latN)
		sum.AvgLatencyMs = &avg
	}
	ps := a.all.percentiles(0.5, 0.95)
	sum.P50LatencyMs, sum.P95LatencyMs, sum.LatencySampled = ps[0], ps[1], a.all.sampled()
	sum.LatencyByOwner.finish()
	sum.ThroughputPerMin = float64(sum.TotalIntents) / window.Minutes()
	for i := range resp.Timeline {
		tb := &resp.Timeline[i]
		p := tb.lat.percentiles(0.5, 0.95)
		tb.P50LatencyMs, tb.P95LatencyMs = p[0], p[1]
		tb.LatencyByOwner.finish()
		tb.Throughput = float64(tb.Total) / a.size.Minutes()
	}
	for _, ti := range a.intents {
		if ti.latN > 0 {
			avg := float64(ti.latSum) / float64(ti.latN)
			ti.AvgLatencyMs = &avg
		}
		resp.TopIntents = append(resp.TopIntents, ti)
	}
	sort.Slice(resp.TopIntents, func(i, j int) bool {
		a, b := resp.TopIntents[i], resp.TopIntents[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.IntentType < b.IntentType
	})
	resp.TopIntents = resp.TopIntents[:min(topN, len(resp.TopIntents))]
	for _, te := range a.codes {
		te.LastSeenAt = isoMicros(te.lastUs)
		resp.TopErrors = append(resp.TopErrors, te)
	}
	sort.Slice(resp.TopErrors, func(i, j int) bool {
		a, b := resp.TopErrors[i], resp.TopErrors[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.ErrorCode < b.ErrorCode
	})
	resp.TopErrors = resp.TopErrors[:min(topN, len(resp.TopErrors))]
}

// fillCounts adds the counts that do not depend on the window.
func (d *Dashboard) fillCounts(ctx context.Context, now time.Time, sum *overviewSummary) error {
	var inFlight []tracing.State
	for _, s := range tracing.States {
		if s.Bucket() == tracing.BucketInFlight {
			inFlight = append(inFlight, s)
		}
	}
	var err error
	sum.InFlightOlderThan15m, err = d.log.CountIntents(ctx, tracing.IntentQuery{Statuses: inFlight,
		Until: now.Add(-15*time.Minute - time.Microsecond)})
	if err != nil {
		return fmt.Errorf("count stale in-flight intents: %w", err)
	}
	if sum.QueueDepth, sum.DeadLetters, err = d.log.MessageDepth(ctx); err != nil {
		return err
	}
	sum.TotalAgents = d.reg.Count()
	sum.ConnectedAgents = d.dir.ConnectedAgents()
	sum.LiveAgents = sum.ConnectedAgents
	sum.StaleAgents = d.reg.SeenBefore(now.Add(-24 * time.Hour))
	return nil
}

// alertsFor derives the overview's alerts from the summary, with the
// thresholds of the reference dashboard.
func alertsFor(s *overviewSummary) []alert {
	out := []alert{}
	if done := s.SuccessCount + s.ErrorCount; done >= 10 {
		rate := float64(s.ErrorCount) / float64(done)
		switch {
		case rate >= 0.25:
			out = append(out, alert{"network-error-rate", "critical", "Error rate is high",
				fmt.Sprintf("%.0f%% of completed intents failed in this window.", rate*100), rate, 0.25, "ratio"})
		case rate >= 0.10:
			out = append(out, alert{"network-error-rate", "warning", "Error rate is elevated",
				fmt.Sprintf("%.0f%% of completed intents failed in this window.", rate*100), rate, 0.10, "ratio"})
		}
	}
	// Only direct intents: bus messages wait minutes for retries by design.
	if d := s.LatencyByOwner[tracing.OwnerDirectory]; d != nil && d.P95LatencyMs != nil {
		p := d.P95LatencyMs
		switch {
		case *p >= 5000:
			out = append(out, alert{"network-latency-p95", "critical", "p95 latency is very high",
				fmt.Sprintf("p95 round trip of direct intents is %d ms.", *p), float64(*p), 5000, "ms"})
		case *p >= 2000:
			out = append(out, alert{"network-latency-p95", "warning", "p95 latency is high",
				fmt.Sprintf("p95 round trip of direct intents is %d ms.", *p), float64(*p), 2000, "ms"})
		}
	}
	if n := s.InFlightOlderThan15m; n >= 1 {
		sev, th := "warning", 1.0
		if n >= 5 {
			sev, th = "critical", 5
		}
		out = append(out, alert{"network-in-flight-backlog", sev, "Intents stuck in flight",
			fmt.Sprintf("%d intents have been in flight for more than 15 minutes.", n), float64(n), th, "intents"})
	}
	if s.DeadLetters > 0 {
		out = append(out, alert{"bus-dead-letters", "warning", "Dead letters waiting",
			fmt.Sprintf("%d bus messages exhausted their retries.", s.DeadLetters), float64(s.DeadLetters), 1, "messages"})
	}
	return out
}

// federationCard asks Config.Federation for its status, bounded in time.
func (d *Dashboard) federationCard(ctx context.Context) federationCard {
	if d.cfg.Federation == nil {
		return federationCard{Configured: false, Message: "Federation is not configured on this directory."}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := d.cfg.Federation(ctx)
	if err != nil {
		d.lg.Warn("dashboard: federation status", "err", err)
		return federationCard{Configured: true, Error: err.Error()}
	}
	return federationCard{Configured: true, Status: st}
}

func (d *Dashboard) handleFederation(w http.ResponseWriter, r *http.Request, _ principal) error {
	httpjson.Write(w, http.StatusOK, d.federationCard(r.Context()))
	return nil
}

// clusterCard is GET /observability/cluster: the cluster's nodes and
// sessions, or configured false on a single node.
type clusterCard struct {
	Configured bool   `json:"configured"`
	Status     any    `json:"status,omitempty"`
	Error      string `json:"error,omitempty"`
}

func (d *Dashboard) handleCluster(w http.ResponseWriter, r *http.Request, _ principal) error {
	if d.cfg.Cluster == nil {
		httpjson.Write(w, http.StatusOK, clusterCard{})
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	st, err := d.cfg.Cluster(ctx)
	if err != nil {
		d.lg.Warn("dashboard: cluster status", "err", err)
		httpjson.Write(w, http.StatusOK, clusterCard{Configured: true, Error: err.Error()})
		return nil
	}
	httpjson.Write(w, http.StatusOK, clusterCard{Configured: true, Status: st})
	return nil
}
