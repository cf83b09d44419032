package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

var (
	alice = "alice@acme.beam.directory"
	bob   = "bob@acme.beam.directory"
	carol = "carol@acme.beam.directory"
)

// seed appends a small mixed history: 3 acked, 1 failed, 1 in flight and
// a dead-lettered bus message.
func seed(b *bundle) {
	flow := []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}
	b.appendFlow("n-ack-1", alice, bob, "task.run", baseTime, 10*time.Millisecond, flow...)
	b.appendFlow("n-ack-2", alice, bob, "task.run", baseTime.Add(time.Minute), 20*time.Millisecond, flow...)
	b.appendFlow("n-ack-3", bob, carol, "quote.request", baseTime.Add(2*time.Minute), 40*time.Millisecond, flow...)
	b.appendFlow("n-fail", alice, carol, "task.run", baseTime.Add(3*time.Minute), 5*time.Millisecond,
		tracing.Received, tracing.Validated, tracing.Failed)
	b.appendFlow("n-open", carol, alice, "inventory.check", baseTime.Add(4*time.Minute), 5*time.Millisecond,
		tracing.Received, tracing.Validated, tracing.Dispatched)
	b.appendDeadLetter("n-dl", "m-dead", baseTime.Add(5*time.Minute))
}

func TestOverviewShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(b)
	b.register("dora")
	r := b.get("/observability/overview?hours=1", viewerToken)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var ov overviewResponse
	r.decode(t, &ov)
	s := ov.Summary
	require.EqualValues(t, 1, ov.WindowHours)
	require.EqualValues(t, 6, s.TotalIntents)
	require.EqualValues(t, 3, s.SuccessCount)
	require.EqualValues(t, 2, s.ErrorCount) // failed + dead_letter
	require.EqualValues(t, 1, s.InFlightCount)
	require.EqualValues(t, 3, s.ByState[tracing.Acked])
	require.EqualValues(t, 1, s.ByState[tracing.DeadLetter])
	require.NotNil(t, s.SuccessRate)
	require.InDelta(t, 0.6, *s.SuccessRate, 1e-9)
	// Latencies of the acked flows: 40, 80, 160 ms (latencyMs), plus the
	// failed and dead-lettered ones (completed - requested).
	require.NotNil(t, s.P95LatencyMs)
	require.NotNil(t, s.P50LatencyMs)
	require.EqualValues(t, 4000, *s.P95LatencyMs) // the dead letter took 4 s
	require.EqualValues(t, 80, *s.P50LatencyMs)
	require.EqualValues(t, 0, s.InFlightOlderThan15m)
	require.EqualValues(t, 1, s.DeadLetters)
	require.EqualValues(t, 0, s.QueueDepth)
	require.Equal(t, 1, s.TotalAgents)
	require.Equal(t, 0, s.ConnectedAgents)
	require.GreaterOrEqual(t, len(ov.Timeline), 30) // 2-minute buckets over 1 h
	require.LessOrEqual(t, len(ov.Timeline), 31)
	var total int64
	for _, tb := range ov.Timeline {
		total += tb.Total
		require.Equal(t, tb.Total, tb.Success+tb.Error+tb.InFlight)
		_, err := time.Parse(time.RFC3339, tb.BucketStart)
		require.NoError(t, err)
	}
	require.EqualValues(t, 6, total)
	require.Equal(t, int64(120), ov.BucketSeconds)
	require.Equal(t, "task.run", ov.TopIntents[0].IntentType)
	require.EqualValues(t, 4, ov.TopIntents[0].Count)
	require.Len(t, ov.TopErrors, 1)
	require.Equal(t, "OFFLINE", ov.TopErrors[0].ErrorCode)
	require.EqualValues(t, 2, ov.TopErrors[0].Count)
	require.False(t, ov.Federation.Configured)
	require.Equal(t, b.log.LastSeq(), ov.LastSeq)

	// The raw shape uses the reference names.
	raw := r.json(t)
	for _, k := range []string{"windowHours", "summary", "timeline", "topIntents", "topErrors", "alerts"} {
		require.Contains(t, raw, k)
	}
	sum := raw["summary"].(map[string]any)
	for _, k := range []string{"totalIntents", "successCount", "errorCount", "inFlightCount", "avgLatencyMs", "p95LatencyMs",
		"successRate", "inFlightOlderThan15m", "connectedAgents", "queueDepth", "deadLetters"} {
		require.Contains(t, sum, k)
	}
	tl := raw["timeline"].([]any)[0].(map[string]any)
	for _, k := range []string{"bucketStart", "total", "success", "error", "inFlight", "p50LatencyMs", "p95LatencyMs", "throughput"} {
		require.Contains(t, tl, k)
	}

	require.Equal(t, http.StatusBadRequest, b.get("/observability/overview?hours=abc", viewerToken).status)
	require.Equal(t, http.StatusBadRequest, b.get("/observability/overview?hours=100000", viewerToken).status)
}

func TestOverviewEmptyAndFederation(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) {
			c.Federation = func(ctx context.Context) (any, error) {
				return map[string]any{"peers": []map[string]any{{"name": "eu", "status": "connected"}}}, nil
			}
		}
	})
	var ov overviewResponse
	b.get("/observability/overview", adminToken).decode(t, &ov)
	require.EqualValues(t, 0, ov.Summary.TotalIntents)
	require.Nil(t, ov.Summary.SuccessRate)
	require.Nil(t, ov.Summary.P95LatencyMs)
	require.GreaterOrEqual(t, len(ov.Timeline), 24) // hourly buckets over 24 h
	require.LessOrEqual(t, len(ov.Timeline), 25)
	require.True(t, ov.Federation.Configured)
	f := b.get("/observability/federation", viewerToken).json(t)
	require.Equal(t, true, f["configured"])
	require.NotNil(t, f["status"])
}

func TestIntentsList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(b)
	list := func(q string) intentsResponse {
		t.Helper()
		r := b.get("/observability/intents?"+q, viewerToken)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		var out intentsResponse
		r.decode(t, &out)
		return out
	}
	nonces := func(l intentsResponse) []string {
		var out []string
		for _, v := range l.Intents {
			out = append(out, v.Nonce)
		}
		return out
	}
	all := list("")
	require.EqualValues(t, 6, all.Total)
	require.Equal(t, []string{"n-dl", "n-open", "n-fail", "n-ack-3", "n-ack-2", "n-ack-1"}, nonces(all), "newest first")
	require.Equal(t, b.log.LastSeq(), all.LastSeq)
	first := all.Intents[5]
	require.Equal(t, alice, first.From)
	require.Equal(t, bob, first.To)
	require.Equal(t, tracing.Acked, first.Status)
	require.Equal(t, tracing.BucketSuccess, first.Bucket)
	require.NotNil(t, first.CompletedAt)
	require.EqualValues(t, 40, *first.RoundTripLatencyMs)
	require.Nil(t, first.Result, "lists carry no result frames")

	require.Equal(t, []string{"n-dl", "n-fail"}, nonces(list("status=error")))
	require.Equal(t, []string{"n-open"}, nonces(list("status=in_flight")))
	require.Equal(t, []string{"n-dl", "n-ack-3", "n-ack-2", "n-ack-1"}, nonces(list("status=acked,dead_letter")))
	require.Equal(t, []string{"n-fail", "n-ack-2", "n-ack-1"}, nonces(list("from="+url.QueryEscape(alice)+"&status=acked,failed")))
	require.Equal(t, []string{"n-dl", "n-open", "n-fail", "n-ack-2", "n-ack-1"}, nonces(list("beamId="+url.QueryEscape(alice))))
	require.Equal(t, []string{"n-ack-3"}, nonces(list("intentType=quote.request")))
	require.Equal(t, []string{"n-ack-3"}, nonces(list("q=quote")))
	require.Equal(t, []string{"n-fail"}, nonces(list("q=n-fa")))
	require.Empty(t, nonces(list("q="+url.QueryEscape("%"))), "LIKE wildcards are literal")
	require.Equal(t, []string{"n-dl", "n-fail"}, nonces(list("errorCode=OFFLINE")))
	since := baseTime.Add(3 * time.Minute).Format(time.RFC3339Nano)
	require.Equal(t, []string{"n-dl", "n-open", "n-fail"}, nonces(list("since="+url.QueryEscape(since))))
	until := baseTime.Add(time.Minute).UnixMilli()
	require.Equal(t, []string{"n-ack-2", "n-ack-1"}, nonces(list("until="+strconv.FormatInt(until, 10))))
	page := list("limit=2&offset=2")
	require.Equal(t, []string{"n-fail", "n-ack-3"}, nonces(page))
	require.EqualValues(t, 6, page.Total)

	for _, bad := range []string{"status=nope", "limit=0", "limit=100000", "since=yesterday", "offset=-1", "hours=0"} {
		r := b.get("/observability/intents?"+bad, viewerToken)
		require.Equal(t, http.StatusBadRequest, r.status, bad)
		require.Equal(t, "INVALID_QUERY", r.json(t)["errorCode"], bad)
	}
}

func TestTraceShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(b)
	// A federated annotation names the peer.
	_, err := b.log.Append(t.Context(), tracing.Event{Nonce: "n-open", State: tracing.Dispatched, Transport: "federation", Attempt: 1,
		At:      baseTime.Add(4*time.Minute + time.Second),
		Details: tracing.Details{Extra: map[string]any{"peer": "https://eu.beam.example", "hopCount": 1}}})
	require.NoError(t, err)

	r := b.get("/observability/intents/n-ack-2", viewerToken)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var tr traceResponse
	r.decode(t, &tr)
	require.Equal(t, "n-ack-2", tr.Intent.Nonce)
	require.Equal(t, tracing.Acked, tr.Intent.Status)
	var states []tracing.State
	for i, s := range tr.Stages {
		states = append(states, s.State)
		require.Equal(t, i+1, s.Index)
		require.Equal(t, "ws", s.Transport)
		require.Equal(t, 1, s.Attempt)
		if i > 0 {
			require.InDelta(t, 20, s.DeltaMs, 0.001)
			require.Greater(t, s.Seq, tr.Stages[i-1].Seq)
		}
	}
	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}, states)
	require.InDelta(t, 80, tr.Stages[4].SinceStartMs, 0.001)
	require.JSONEq(t, `{"timeoutMs":30000}`, string(tr.Stages[2].Details))
	var req map[string]any
	require.NoError(t, json.Unmarshal(tr.Request, &req))
	require.Equal(t, "n-ack-2", req["nonce"])
	var res map[string]any
	require.NoError(t, json.Unmarshal(tr.Result, &res))
	require.Equal(t, true, res["success"])
	require.Empty(t, tr.Links)
	require.NotContains(t, string(tr.Stages[0].Details), "frame", "frames are served once, not per stage")

	var open traceResponse
	b.get("/observability/intents/n-open", viewerToken).decode(t, &open)
	require.Len(t, open.Links, 1)
	require.Equal(t, "peer-trace", open.Links[0].Rel)
	require.Equal(t, "https://eu.beam.example", open.Links[0].Peer)
	require.Equal(t, "https://eu.beam.example/dashboard/#/intents/n-open", open.Links[0].Href)
	require.True(t, open.Stages[len(open.Stages)-1].Annotation)
	require.JSONEq(t, "null", string(open.Result))

	var dl traceResponse
	b.get("/observability/intents/n-dl", viewerToken).decode(t, &dl)
	require.NotNil(t, dl.Message)
	require.Equal(t, "m-dead", dl.Message.ID)

	r = b.get("/observability/intents/missing", viewerToken)
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, "NOT_FOUND", r.json(t)["errorCode"])
}

func TestErrorsShape(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(b)
	var er errorsResponse
	b.get("/observability/errors?hours=1", viewerToken).decode(t, &er)
	require.EqualValues(t, 2, er.Summary.TotalErrors)
	require.EqualValues(t, 2, er.Summary.OfflineCount)
	require.EqualValues(t, 1, er.Summary.DeadLetterCount)
	require.Equal(t, 1, er.Summary.DistinctErrorCodes)
	require.Len(t, er.Codes, 1)
	require.Equal(t, "OFFLINE", er.Codes[0].ErrorCode)
	require.Equal(t, 1, er.Codes[0].AffectedSenders)
	require.Equal(t, 2, er.Codes[0].AffectedRecipients)
	require.NotEmpty(t, er.Routes)
}

func TestAgentsView(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register("alice")
	b.register("bob")
	var out agentsResponse
	b.get("/observability/agents", viewerToken).decode(t, &out)
	require.EqualValues(t, 2, out.Total)
	require.Equal(t, 2, out.Registered)
	require.Equal(t, 0, out.Connected)
	require.Len(t, out.Agents, 2)
	a := out.Agents[0]
	require.Equal(t, alice, a.BeamID)
	require.Equal(t, "acme", a.Org)
	require.False(t, a.Connected)
	require.NotNil(t, a.LastSeen)
	require.Equal(t, "ws", a.Delivery)
	require.Equal(t, "Directory default policy", a.Policy.Summary)
	raw := b.get("/observability/agents?q=bob", viewerToken)
	require.NotContains(t, string(raw.body), "apiKey")
	require.NotContains(t, string(raw.body), "publicKey")
	raw.decode(t, &out)
	require.Len(t, out.Agents, 1)
	b.get("/observability/agents?connected=1", viewerToken).decode(t, &out)
	require.Empty(t, out.Agents)
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(b)
	var list deadLettersResponse
	b.get("/observability/dead-letters", adminToken).decode(t, &list)
	require.EqualValues(t, 1, list.Total)
	require.Len(t, list.DeadLetters, 1)
	m := list.DeadLetters[0]
	require.Equal(t, "m-dead", m.ID)
	require.Equal(t, "n-dl", m.Nonce)
	require.Equal(t, 2, m.RetryCount)
	require.Equal(t, 2, m.MaxRetries)
	require.Equal(t, "retries exhausted", m.Error)
	require.NotNil(t, m.FailedAt)
	require.True(t, list.Requeue.Allowed)

	var det deadLetterDetail
	b.get("/observability/dead-letters/m-dead", adminToken).decode(t, &det)
	require.JSONEq(t, `{"job":"x"}`, string(det.Payload))
	require.NotNil(t, det.Intent)
	require.Equal(t, tracing.DeadLetter, det.Intent.Status)
	require.Equal(t, http.StatusNotFound, b.get("/observability/dead-letters/nope", adminToken).status)

	// Requeue through the operator function, then it is no dead letter.
	req := b.req("POST", "/observability/dead-letters/m-dead/requeue", nil, "Authorization", "Bearer "+adminToken)
	r := do(t, b.client(), req)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r = do(t, b.client(), b.req("POST", "/observability/dead-letters/m-dead/requeue", nil, "Authorization", "Bearer "+adminToken))
	require.Equal(t, http.StatusConflict, r.status)
	require.Equal(t, "NOT_DEAD_LETTER", r.json(t)["errorCode"])
	b.get("/observability/dead-letters", adminToken).decode(t, &list)
	require.EqualValues(t, 0, list.Total)
}

func TestNotFoundUnderObservability(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.get("/observability/nope", viewerToken)
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, "NOT_FOUND", r.json(t)["errorCode"])
}

// The overview picks its window from the data's age when asked for
// hours=auto, and keeps the latency of bus messages (retries, minutes)
// apart from direct intents (milliseconds).
func TestOverviewAutoWindowAndLatencyByOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	empty := b.get("/observability/overview?hours=auto", adminToken)
	require.Equal(t, http.StatusOK, empty.status, string(empty.body))
	var e struct {
		WindowHours   float64 `json:"windowHours"`
		AutoWindow    bool    `json:"autoWindow"`
		BucketSeconds int64   `json:"bucketSeconds"`
	}
	require.NoError(t, json.Unmarshal(empty.body, &e))
	require.Equal(t, 0.25, e.WindowHours, "an empty log gets the shortest window")
	require.True(t, e.AutoWindow)
	require.EqualValues(t, 30, e.BucketSeconds)

	now := time.Now()
	b.appendFlow("n-direct", "alice@acme.beam.directory", "bob@acme.beam.directory", "task.run", now.Add(-2*time.Hour), 5*time.Millisecond,
		tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked)
	b.retryTrace("n-bus", now.Add(-time.Minute))
	r := b.get("/observability/overview?hours=auto", adminToken)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var o struct {
		WindowHours float64 `json:"windowHours"`
		Summary     struct {
			LatencyByOwner map[string]struct {
				Count int64  `json:"count"`
				P95   *int64 `json:"p95LatencyMs"`
			} `json:"latencyByOwner"`
		} `json:"summary"`
		Alerts []struct {
			ID string `json:"id"`
		} `json:"alerts"`
	}
	require.NoError(t, json.Unmarshal(r.body, &o))
	require.Equal(t, 6.0, o.WindowHours, "two-hour-old data gets the 6 h window")
	lo := o.Summary.LatencyByOwner
	require.EqualValues(t, 1, lo["directory"].Count)
	require.EqualValues(t, 20, *lo["directory"].P95)
	require.EqualValues(t, 1, lo["bus"].Count)
	require.EqualValues(t, 34000, *lo["bus"].P95)
	for _, a := range o.Alerts {
		require.NotEqual(t, "network-latency-p95", a.ID, "a bus retry is no latency alert")
	}

	bad := b.get("/observability/overview?hours=soon", adminToken)
	require.Equal(t, http.StatusBadRequest, bad.status)
}
