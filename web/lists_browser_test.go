package web

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

// queueFor appends a bus message to `to` that waits in state (queued or
// dispatched).
func (b *bundle) queueFor(nonce, to string, dispatched bool) {
	b.t.Helper()
	evs := []tracing.Event{
		{Nonce: nonce, State: tracing.Received, From: "alice@acme.beam.directory", To: to, IntentType: "task.run", Transport: "bus",
			Details: tracing.Details{Owner: tracing.OwnerBus, Bus: &tracing.BusMessage{MessageID: "msg-" + nonce, MaxRetries: 3}}},
		{Nonce: nonce, State: tracing.Queued, Transport: "bus"},
	}
	if dispatched {
		evs = append(evs, tracing.Event{Nonce: nonce, State: tracing.Dispatched, Transport: "bus", Attempt: 1})
	}
	_, err := b.log.Append(context.Background(), evs...)
	require.NoError(b.t, err)
}

func TestBrowserListsPageInboxAndBulkRequeue(t *testing.T) {
	b := setup(t)
	ctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "lists")

	start := time.Now().Add(-time.Hour)
	for i := 0; i < 120; i++ {
		b.appendFlow(fmt.Sprintf("n-flow-%03d", i), "alice@acme.beam.directory", "bob@acme.beam.directory", "task.run",
			start.Add(time.Duration(i)*time.Second), time.Millisecond, tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked)
	}
	for i := 0; i < 103; i++ {
		b.appendDeadLetter(fmt.Sprintf("n-dead-%03d", i), fmt.Sprintf("msg-dead-%03d", i), start.Add(time.Duration(i)*time.Second))
	}
	b.register("bob")
	for i := 0; i < 100; i++ {
		b.register(fmt.Sprintf("agent%03d", i))
	}
	b.queueFor("n-q-1", "bob@acme.beam.directory", false)
	b.queueFor("n-q-2", "bob@acme.beam.directory", false)
	b.queueFor("n-q-3", "bob@acme.beam.directory", true)
	intents := 120 + 103 + 3

	b.browserLogin(ctx)

	pagerText := func(id string) string {
		return browsertest.Eval[string](t, ctx, fmt.Sprintf(`document.querySelector("#%s .pager-text").textContent`, id))
	}

	// Intents: 100 a page, then the rest.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/intents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#intent-rows tr[data-nonce]").length === 100 && !!document.querySelector("#intents-pager:not([hidden])")`)
	require.Equal(t, fmt.Sprintf("1–100 of %d", intents), pagerText("intents-pager"))
	require.True(t, browsertest.Eval[bool](t, ctx, `document.querySelector('#intents-pager [data-page="prev"]').disabled`))
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.CSS(`#intents-pager [data-page="next"]`)))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelector("#intents-pager .pager-text").textContent.startsWith("101–200")`)
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.CSS(`#intents-pager [data-page="next"]`)))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelector("#intents-pager .pager-text").textContent.startsWith("201–")`)
	require.Equal(t, intents-200, browsertest.Eval[int](t, ctx, `document.querySelectorAll("#intent-rows tr[data-nonce]").length`))
	require.True(t, browsertest.Eval[bool](t, ctx, `document.querySelector('#intents-pager [data-page="next"]').disabled`))
	shots.Shot(ctx, "01-intents-page-3")

	// Agents: the inbox depth of bob, and a second page.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/agents")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 100`)
	require.Equal(t, "1–100 of 101", pagerText("agents-pager"))
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.CSS(`#agents-pager [data-page="next"]`)))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 1`)
	require.Equal(t, "101–101 of 101", pagerText("agents-pager"))
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/agents?q=bob")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("tbody tr.row-link").length === 1`)
	cell := `document.querySelector("tbody tr.row-link td.inbox")`
	inbox := browsertest.Eval[[]string](t, ctx, fmt.Sprintf(`(c => [c.dataset.queued, c.dataset.dispatched, c.textContent])(%s)`, cell))
	require.Equal(t, []string{"2", "1"}, inbox[:2])
	require.Contains(t, inbox[2], "2 queued")
	shots.Shot(ctx, "02-agents-inbox")

	// Dead letters: page, then requeue two at once.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#content tr[data-id]").length === 100`)
	require.Equal(t, "1–100 of 103", pagerText("dl-pager"))
	picked := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll("input[data-pick]")].slice(0, 2).map((c) => { c.click(); return c.dataset.pick; })`)
	require.Len(t, picked, 2)
	browsertest.WaitJS(t, ctx, 5*time.Second, `document.getElementById("dl-bulk-count")?.textContent === "2 selected"`)
	shots.Shot(ctx, "03-dead-letters-selected")
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.ID("dl-bulk-requeue")))
	browsertest.WaitJS(t, ctx, 5*time.Second, `document.getElementById("dl-bulk-requeue").textContent.startsWith("Confirm")`)
	b.mu.Lock()
	require.Empty(t, b.requeued, "the first click only arms the button")
	b.mu.Unlock()
	browsertest.Run(t, ctx, 5*time.Second, chromedp.Click(chromedp.ID("dl-bulk-requeue")))
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.requeued) == 2
	}, 10*time.Second, 20*time.Millisecond)
	b.mu.Lock()
	got := slices.Clone(b.requeued)
	b.mu.Unlock()
	slices.Sort(got)
	slices.Sort(picked)
	require.Equal(t, picked, got)
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelector("#dl-pager .pager-text").textContent === "1–100 of 101"`)
	require.True(t, browsertest.Eval[bool](t, ctx, `document.getElementById("dl-bulk").hidden`))

	// A viewer cannot pick dead letters at all.
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`#logout-form button`)), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), viewerToken), chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(".sidebar")), chromedp.Navigate(b.url("/dashboard/#/dead-letters")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelectorAll("#content tr[data-id]").length === 100`)
	raw := browsertest.Eval[string](t, ctx, `JSON.stringify([...document.querySelectorAll("input[data-pick]")].map((c) => c.disabled))`)
	var disabled []bool
	require.NoError(t, json.Unmarshal([]byte(raw), &disabled))
	require.Len(t, disabled, 100)
	require.NotContains(t, disabled, false)
	t.Logf("screenshots in %s", shots.Dir())
}
