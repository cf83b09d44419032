package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

// shopJobs starts the job bus on the bundle's log and publishes two jobs
// in namespace shop: one open, one dead ("carrier down"), whose id it
// returns.
func (b *bundle) shopJobs() (*jobs.Service, string) {
	t := b.t
	t.Helper()
	svc, err := jobs.Open(context.Background(), jobs.Config{Log: b.log, Secret: "main"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Close() })
	b.dash.SetJobs(svc)
	h := svc.Handler()
	call := func(method, path, body string) map[string]any {
		req := httptest.NewRequest(method, path, bytes.NewReader([]byte(body)))
		req.Header.Set("X-API-KEY", "main")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Less(t, w.Code, 300, w.Body.String())
		var m map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &m)
		return m
	}
	call("POST", "/intent", `{"goal":"mail","payload":1,"namespace":"shop"}`)
	dead := call("POST", "/intent", `{"goal":"sms","payload":2,"namespace":"shop","max_attempts":1}`)["id"].(string)
	cl := call("POST", "/claim?namespace=shop&goal=sms", "")
	call("POST", "/fail/"+dead, fmt.Sprintf(`{"claim_token":%q,"error":"carrier down"}`, cl["claim_token"]))
	return svc, dead
}

// TestBrowserJobsPage: the Jobs page shows the Intent Protocol queues by
// namespace and status and the dead letters, and its Retry button moves a
// dead job back to open.
func TestBrowserJobsPage(t *testing.T) {
	b := setup(t)
	svc, dead := b.shopJobs()

	ctx := browsertest.Start(t)
	b.browserLogin(ctx)
	browsertest.Run(t, ctx, 10*time.Second, chromedp.Navigate(b.url("/dashboard/#/jobs")))
	browsertest.WaitJS(t, ctx, 10*time.Second, `!!document.querySelector('#jobs-queues tr[data-ns="shop"]')`)
	cells := browsertest.Eval[[]string](t, ctx, `[...document.querySelectorAll('#jobs-queues tr[data-ns="shop"] td')].map(td => td.textContent)`)
	require.Equal(t, []string{"shop", "1", "0", "0", "1"}, cells)
	browsertest.WaitJS(t, ctx, 5*time.Second, fmt.Sprintf(`!!document.querySelector('#jobs-dead-list tr[data-id=%q]')`, dead))
	reason := browsertest.Eval[string](t, ctx, fmt.Sprintf(`document.querySelector('#jobs-dead-list tr[data-id=%q]').textContent`, dead))
	require.Contains(t, reason, "carrier down")

	browsertest.ClickJS(t, ctx, fmt.Sprintf(`button[data-op="retry"][data-job=%q]`, dead))
	browsertest.WaitJS(t, ctx, 10*time.Second, fmt.Sprintf(`!document.querySelector('#jobs-dead-list tr[data-id=%q]')`, dead))
	require.Eventually(t, func() bool { return svc.Counts()["shop"][tracing.JobOpen] == 2 }, 5*time.Second, 20*time.Millisecond)
}
