package web

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/browsertest"
)

// TestBrowserFederationRetryAndReplayHints: while a peer is down the Federation page
// says its waiting messages are being retried, and it names the commands
// that list and resend the rows the relay gave up on (beam peer outbox,
// beam peer replay ROW-ID) instead of "the CLI"; it fits a 390 px phone.
func TestBrowserFederationRetryAndReplayHints(t *testing.T) {
	now := time.Now().UTC()
	iso := func(d time.Duration) string { return now.Add(-d).Format(time.RFC3339Nano) }
	status := map[string]any{
		"self":   map[string]any{"domain": "alpha.beam.directory", "url": "nats://127.0.0.1:4222"},
		"peers":  []map[string]any{{"domain": "beta.beam.directory", "url": "nats://127.0.0.1:4223", "addedAt": iso(time.Hour), "lastContact": iso(2 * time.Minute)}},
		"links":  []map[string]any{{"peer": "beta.beam.directory", "connected": false, "lastError": "nats: connection refused"}},
		"outbox": map[string]any{"PENDING": 3, "DEAD": 1, "PUBLISHED": 40},
		"backlog": map[string]any{"beta.beam.directory": map[string]any{"depth": 3, "oldest": iso(84 * time.Second),
			"lastError": "nats: no responders available for request"}},
		"dead": []map[string]any{{"id": 7, "nonce": "n-gave-up", "peer": "beta.beam.directory", "kind": "intent", "attempts": 10, "maxAttempts": 10,
			"lastError": "nats: no responders available for request", "updatedAt": iso(time.Minute)}},
	}
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.Federation = func(context.Context) (any, error) { return status, nil } }
	})
	ctx := browsertest.Start(t)
	shots := browsertest.NewShooter(t, "federation")
	b.browserLogin(ctx)
	for _, w := range []int{1440, 390} {
		browsertest.Run(t, ctx, 10*time.Second, chromedp.EmulateViewport(int64(w), 900), chromedp.Navigate(b.url("/dashboard/#/federation")))
		browsertest.WaitJS(t, ctx, 10*time.Second, `document.querySelector("#federation-dead tbody tr") && !document.querySelector("#m-fed-waiting .skeleton")`)
		requireNoOverflow(t, ctx, "federation", w)
		shots.Shot(ctx, fmt.Sprintf("%d-peer-down", w))
		require.Equal(t, "peer down, retrying", browsertest.Eval[string](t, ctx, `document.querySelector("#m-fed-waiting .hint").textContent`))
		require.Contains(t, browsertest.Eval[string](t, ctx, `document.querySelector('#federation-peers tr[data-peer="beta.beam.directory"] td[data-col="link"]').textContent`),
			"peer down, retrying")
		hint := browsertest.Eval[string](t, ctx, `document.getElementById("federation-replay-hint").textContent`)
		require.Contains(t, hint, "beam peer outbox --state DEAD")
		require.Contains(t, hint, "beam peer replay ROW-ID")
		require.Equal(t, "beam peer replay 7", browsertest.Eval[string](t, ctx, `[...document.querySelectorAll("#federation-dead tbody td")].pop().textContent`))
		require.Contains(t, browsertest.Eval[string](t, ctx, `document.querySelector("#m-fed-dead .hint").textContent`), "beam peer replay")
		require.NotContains(t, browsertest.Eval[string](t, ctx, `document.body.innerText`), "from the CLI")
		require.False(t, browsertest.Eval[bool](t, ctx, `document.body.innerText.includes("\"backlog\"")`), "the backlog shows in the peers table, not again as raw JSON")
	}
}
