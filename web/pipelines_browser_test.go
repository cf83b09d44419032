package web

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

// meshStep encodes a pipeline step for details.mesh.
func meshStep(t testing.TB, st tracing.MeshStep) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(st)
	require.NoError(t, err)
	return raw
}

// appendEnvelope writes the log of an envelope that creator sent through
// route, one hop every 200 ms from at, ending in x-sink, as the pipeline
// engine writes it.
func (b *bundle) appendEnvelope(id, creator string, route []string, at time.Time, headers ...map[string]string) {
	b.t.Helper()
	nonce := "mesh:" + id
	env := func(hop int) json.RawMessage {
		r := map[string]any{"prev": route[:hop], "curr": "", "next": []string{}}
		if hop < len(route) {
			r["curr"], r["next"] = route[hop], route[hop+1:]
		}
		h := map[string]string{}
		if len(headers) > 0 {
			h = headers[0]
		}
		raw, err := json.Marshal(map[string]any{"id": id, "route": r, "headers": h, "payload": map[string]any{"hop": hop}, "hop": hop, "creator": creator})
		require.NoError(b.t, err)
		return raw
	}
	ev := func(st tracing.State, ms int, step tracing.MeshStep) tracing.Event {
		return tracing.Event{Nonce: nonce, State: st, At: at.Add(time.Duration(ms) * time.Millisecond), Transport: "mesh",
			Details: tracing.Details{Owner: tracing.OwnerMesh, Mesh: meshStep(b.t, step)}}
	}
	created := ev(tracing.Received, 0, tracing.MeshStep{Kind: tracing.MeshKindCreated, ID: id, Creator: creator, Status: tracing.MeshPending,
		Envelope: env(0), Actor: route[0]})
	created.From, created.To, created.IntentType = creator, route[0], "mesh.envelope"
	evs := []tracing.Event{created, ev(tracing.Queued, 5, tracing.MeshStep{Kind: tracing.MeshKindWait})}
	for i, actor := range route {
		base := 10 + i*200
		evs = append(evs,
			ev(tracing.Dispatched, base, tracing.MeshStep{Kind: tracing.MeshKindDispatch, Status: tracing.MeshRunning, Actor: actor, Attempt: 1}),
			tracing.Event{Nonce: nonce, State: tracing.Delivered, At: at.Add(time.Duration(base+50) * time.Millisecond), Transport: "mesh"})
		progress := float64(i+1) * 100 / float64(len(route))
		if i+1 < len(route) {
			evs = append(evs, ev(tracing.Queued, base+150, tracing.MeshStep{Kind: tracing.MeshKindHop, Status: tracing.MeshRunning,
				Envelope: env(i + 1), Hop: i + 1, Actor: route[i+1], Progress: progress}))
		} else {
			evs = append(evs, ev(tracing.Acked, base+150, tracing.MeshStep{Kind: tracing.MeshKindSink, Status: tracing.MeshSucceeded,
				Envelope: env(i + 1), Hop: i + 1, Progress: 100, Sink: true}))
		}
	}
	_, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
}

// appendPeerOutage writes a durable cross-directory send whose peer is
// down: dispatched to the federation outbox, then claimed and put back
// with the publish error retries times, as the outbox relay records it.
func (b *bundle) appendPeerOutage(nonce string, retries int, at time.Time) {
	b.t.Helper()
	step := func(state string, attempts int, lastErr string, ms int) map[string]any {
		return map[string]any{"outbox": map[string]any{"eventId": "ev-" + nonce, "state": state, "peer": "beta.beam.directory",
			"attempts": attempts, "lastError": lastErr, "at": at.Add(time.Duration(ms) * time.Millisecond).UnixMicro()}}
	}
	evs := []tracing.Event{
		{Nonce: nonce, State: tracing.Received, At: at, From: "alice@alpha.beam.directory", To: "bob@beta.beam.directory",
			IntentType: "report.build", Transport: "bus", Details: tracing.Details{Owner: tracing.OwnerBus,
				Bus: &tracing.BusMessage{MessageID: "msg-" + nonce, Payload: json.RawMessage(`{"job":"z"}`), MaxRetries: 5}}},
		{Nonce: nonce, State: tracing.Dispatched, At: at.Add(time.Second), Transport: "federation", Attempt: 1,
			Details: tracing.Details{Extra: step("PENDING", 0, "", 1000)}},
	}
	for i := 0; i < retries; i++ {
		ms := 2000 + i*4000
		evs = append(evs,
			tracing.Event{Nonce: nonce, State: tracing.Dispatched, At: at.Add(time.Duration(ms) * time.Millisecond), Transport: "federation", Attempt: 1,
				Details: tracing.Details{Extra: step("CLAIMED", i, "", ms)}},
			tracing.Event{Nonce: nonce, State: tracing.Dispatched, At: at.Add(time.Duration(ms+100) * time.Millisecond), Transport: "federation", Attempt: 1,
				Details: tracing.Details{Extra: step("PENDING", i+1, "nats: no responders available for request", ms+100)}})
	}
	_, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
}

// browserLogin signs the browser in to the bundle's dashboard with the
// operator token.
func (b *bundle) browserLogin(ctx context.Context) {
	b.t.Helper()
	browsertest.Run(b.t, ctx, 20*time.Second,
		chromedp.Navigate(b.url("/dashboard/login")), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")))
}

// TestBrowserPipelineListAndEnvelope: the pipelines list names each
// envelope's route, creator and creation time; the envelope page gives
// every hop its times and names the actor of each waterfall row; on a
// 390 px phone both fit the screen and each value carries its column's
// name.
func TestBrowserPipelineListAndEnvelope(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "pipelines")
	route := []string{"warehouse@demo.beam.directory", "finance@demo.beam.directory", "partner-desk@demo.beam.directory"}
	b.appendEnvelope("env-1", "procurement@demo.beam.directory", route, time.Now().Add(-2*time.Minute))
	b.browserLogin(ctx)

	row := `document.querySelector('#mesh-table tr[data-id="env-1"]')`
	for _, w := range []int{1440, 390} {
		browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(int64(w), 900), chromedp.Navigate(b.url("/dashboard/#/pipelines")))
		browsertest.WaitJS(t, ctx, 10*time.Second, row)
		requireNoOverflow(t, ctx, "pipelines", w)
		shots.Shot(ctx, fmt.Sprintf("%d-list", w))
		cells := browsertest.Eval[[]string](t, ctx, `[...`+row+`.querySelectorAll("td")].map((td) => td.textContent.trim())`)
		require.Equal(t, "warehouse → finance → partner-desk", cells[3])
		require.Equal(t, "procurement", cells[4])
		require.Equal(t, "2 min ago", cells[5])
		if w == 390 {
			labels := browsertest.Eval[[]string](t, ctx, `[...`+row+`.querySelectorAll("td")].slice(1).map((td) => getComputedStyle(td, "::before").content)`)
			require.Equal(t, []string{`"Status"`, `"Progress"`, `"Route"`, `"Creator"`, `"Created"`, `"Reason"`}, labels)
		}

		browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/pipelines/env-1")))
		browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#mesh-hops li").length === 3 && document.querySelector("#mesh-waterfall .wf-stage")`)
		requireNoOverflow(t, ctx, "envelope", w)
		shots.Shot(ctx, fmt.Sprintf("%d-envelope", w))
		times := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll("#mesh-hops .hop-time")].map((e) => e.textContent)`)
		require.Len(t, times, 3)
		for _, s := range times {
			require.Regexp(t, `^started \d\d:\d\d:\d\d\.\d{3} · took 150 ms$`, s)
		}
		// Each waterfall row names its actor: the creator received it, each
		// actor was queued for, dispatched and delivered, x-sink acked it.
		rows := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll("#mesh-waterfall .wf-stage")].map((r) => r.dataset.state + " " + r.querySelector(".wf-actor").textContent)`)
		require.Equal(t, []string{"received procurement", "queued warehouse", "dispatched warehouse", "delivered warehouse",
			"queued finance", "dispatched finance", "delivered finance", "queued partner-desk", "dispatched partner-desk",
			"delivered partner-desk", "acked x-sink"}, rows)
		require.Equal(t, "warehouse → finance → partner-desk", strings.TrimSpace(browsertest.Eval[string](t, ctx, `document.getElementById("mesh-route").textContent`)))
		require.Equal(t, "procurement@demo.beam.directory", browsertest.Eval[string](t, ctx, `document.getElementById("mesh-creator").textContent`))
	}
}

// TestBrowserEnvelopeNamesItsProtocol: the envelope page says whether an
// A2A task, an MCP tool call or the gateway created the envelope, and for
// which declared pipeline.
func TestBrowserEnvelopeNamesItsProtocol(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	route := []string{"warehouse@demo.beam.directory"}
	b.appendEnvelope("env-gw", "procurement@demo.beam.directory", route, time.Now().Add(-time.Minute))
	b.appendEnvelope("env-a2a", "procurement@demo.beam.directory", route, time.Now().Add(-time.Minute),
		map[string]string{"x-beam-protocol": "a2a", "x-beam-pipeline": "enrich"})
	b.appendEnvelope("env-mcp", "procurement@demo.beam.directory", route, time.Now().Add(-time.Minute),
		map[string]string{"x-beam-protocol": "mcp", "x-beam-pipeline": "enrich"})
	b.browserLogin(ctx)
	for id, want := range map[string]string{
		"env-gw": "the gateway (POST /api/v1/mesh)", "env-a2a": "A2A task · pipeline enrich", "env-mcp": "MCP tool call · pipeline enrich",
	} {
		browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/pipelines/"+id)))
		browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelector('.envelope-id')?.textContent === "`+id+`" && document.getElementById("mesh-protocol")`)
		require.Equal(t, want, browsertest.Eval[string](t, ctx, `document.getElementById("mesh-protocol").textContent`), id)
	}
}

// TestBrowserPeerOutageIsOneRow: a durable cross-directory send retried
// through a peer outage shows as one row with the number of attempts and
// "peer down, retrying", in the lifecycle and in the waterfall, not as one
// identical dispatched row per outbox step.
func TestBrowserPeerOutageIsOneRow(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "outage")
	b.appendPeerOutage("n-outage-1", 11, time.Now().Add(-3*time.Minute))
	b.browserLogin(ctx)
	for _, w := range []int{1440, 390} {
		browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(int64(w), 900), chromedp.Navigate(b.url("/dashboard/#/intents/n-outage-1")))
		browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#timeline > li").length > 0`)
		requireNoOverflow(t, ctx, "outage trace", w)
		shots.Shot(ctx, fmt.Sprintf("%d-trace", w))
		states := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll("#timeline > li")].map((li) => li.dataset.state + (li.dataset.count ? " x" + li.dataset.count : ""))`)
		require.Equal(t, []string{"received", "dispatched", "dispatched x22"}, states, "22 outbox steps fold into one row")
		group := browsertest.Eval[string](t, ctx, `document.querySelector("#timeline > li.tl-group").textContent`)
		require.Contains(t, group, "peer down, retrying")
		require.Contains(t, group, "× 11 attempts")
		require.Contains(t, group, "nats: no responders available for request")
		wf := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll("#waterfall .wf-stage")].map((r) => r.dataset.kind + ":" + r.querySelector(".wf-name").textContent)`)
		require.Equal(t, []string{"active:received", "active:dispatched", "outbox-retry:peer down, retrying"}, wf)
	}
}
