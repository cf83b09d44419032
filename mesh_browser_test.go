package beam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/browsertest"
	"github.com/beamdir/beam/tracing"
)

// TestBrowserPipelineView drives the pipeline view against the real stack:
// an envelope's hops as a timeline with payloads, its fan-out child in the
// tree, a live update while the page is open, and the requeue of a dead
// envelope by an admin.
func TestBrowserPipelineView(t *testing.T) {
	browsertest.SkipWithoutChromium(t)
	// The gate actor holds its hop while the page is driven: its timeout
	// must outlast a slow browser, and nothing here waits for it to fire.
	l := startLive(t, Config{Pipelines: Pipelines{HopTimeout: 2 * time.Minute}})
	shots := browsertest.NewShooter(t, "pipelines")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	creator := l.agent("client", "mesh.beam.directory")
	var healthy atomic.Bool
	gate := make(chan struct{})
	handlers := map[string]agents.MeshHandler{
		"fan": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			if err := h.Yield(map[string]any{"part": 1}); err != nil {
				return nil, err
			}
			return map[string]any{"part": 2}, nil
		},
		"enrich": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			m := map[string]any{}
			if err := h.Bind(&m); err != nil {
				return nil, err
			}
			m["enriched"] = true
			return m, nil
		},
		"broken": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			if healthy.Load() {
				return map[string]any{"fixed": true}, nil
			}
			return nil, errors.New("the broken actor is down")
		},
		"gate": func(ctx context.Context, h *agents.MeshHop) (any, error) {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return map[string]any{"opened": true}, nil
		},
	}
	for name, h := range handlers {
		c := l.agent(name, "mesh.beam.directory")
		c.HandleMesh(h)
		require.NoError(t, c.Connect(ctx))
	}
	actor := func(name string) string { return name + "@mesh.beam.directory" }
	create := func(route ...string) string {
		body, _ := json.Marshal(map[string]any{"route": route, "payload": map[string]any{"start": true}})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url+"/api/v1/mesh", strings.NewReader(string(body)))
		require.NoError(t, err)
		req.Header.Set("X-Api-Key", creator.APIKey())
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		var out struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out.ID
	}
	final := func(id string) tracing.MeshRow {
		var row tracing.MeshRow
		require.Eventually(t, func() bool {
			r, ok, err := l.srv.Log().MeshEnvelope(ctx, id)
			row = r
			return err == nil && ok && r.Status.Terminal()
		}, 30*time.Second, 20*time.Millisecond)
		return row
	}
	ok := create(actor("fan"), actor("enrich"))
	dead := create(actor("broken"), actor("enrich"))
	require.Equal(t, tracing.MeshSucceeded, final(ok).Status)
	require.Equal(t, tracing.MeshFailed, final(dead).Status)

	bctx := browsertest.Start(t)
	login(t, bctx, l.url, browserAdminToken)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(l.url+"/dashboard/#/pipelines"))
	browsertest.WaitJS(t, bctx, 10*time.Second, fmt.Sprintf(`document.querySelector('#mesh-table tr[data-id=%q]')`, ok))
	require.Equal(t, "succeeded", browsertest.Eval[string](t, bctx, fmt.Sprintf(`document.querySelector('#mesh-table tr[data-id=%q]').dataset.status`, ok)))
	require.Equal(t, "failed", browsertest.Eval[string](t, bctx, fmt.Sprintf(`document.querySelector('#mesh-table tr[data-id=%q]').dataset.status`, dead)))
	shots.Shot(bctx, "01-list")

	// The detail: two hops, each with its payload; the fan-out child in the tree.
	// The list re-renders on every log event: click the row as it is now.
	clickRow := func(id string) {
		browsertest.WaitJS(t, bctx, 10*time.Second, fmt.Sprintf(`(() => { const r = document.querySelector('#mesh-table tr[data-id=%q]'); if (r) r.click(); return location.hash.includes(%q); })()`, id, id))
	}
	clickRow(ok)
	browsertest.WaitJS(t, bctx, 10*time.Second, `document.querySelector("#mesh-status") && document.querySelector("#mesh-status").dataset.status === "succeeded"`)
	hops := browsertest.Eval[[]string](t, bctx, `[...document.querySelectorAll("#mesh-hops li")].map(li => li.dataset.actor + ":" + li.dataset.outcome)`)
	require.Equal(t, []string{actor("fan") + ":done", actor("enrich") + ":done"}, hops)
	require.Contains(t, browsertest.Eval[string](t, bctx, `document.querySelector("#mesh-hops").textContent`), `"enriched": true`)
	browsertest.WaitJS(t, bctx, 10*time.Second, `document.querySelectorAll("#mesh-children li").length === 1`)
	require.Equal(t, "succeeded", browsertest.Eval[string](t, bctx, `document.querySelector("#mesh-children li").dataset.status`))
	require.Equal(t, "100%", strings.TrimSpace(browsertest.Eval[string](t, bctx, `document.querySelector("#mesh-progress").textContent`)))
	shots.Shot(bctx, "02-detail")

	// Live: a held envelope turns succeeded on the open page.
	held := create(actor("gate"))
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(l.url+"/dashboard/#/pipelines/"+held))
	browsertest.WaitJS(t, bctx, 10*time.Second, `document.querySelector("#mesh-status") && document.querySelector("#mesh-status").dataset.status === "running"`)
	shots.Shot(bctx, "03-running")
	close(gate)
	browsertest.WaitJS(t, bctx, 15*time.Second, `document.querySelector("#mesh-status").dataset.status === "succeeded"`)
	shots.Shot(bctx, "04-live-succeeded")

	// The dead envelope: requeue from the page once the actor is fixed.
	healthy.Store(true)
	browsertest.Run(t, bctx, 10*time.Second, chromedp.Navigate(l.url+"/dashboard/#/pipelines?dead=1"))
	browsertest.WaitJS(t, bctx, 10*time.Second, fmt.Sprintf(`document.querySelector('#mesh-table tr[data-id=%q]')`, dead))
	clickRow(dead)
	browsertest.WaitJS(t, bctx, 10*time.Second, `document.querySelector("#mesh-requeue")`)
	require.Contains(t, browsertest.Eval[string](t, bctx, `document.querySelector("#mesh-sinks").textContent`), "sump")
	shots.Shot(bctx, "05-dead")
	browsertest.ClickJS(t, bctx, "#mesh-requeue")
	browsertest.WaitJS(t, bctx, 15*time.Second, fmt.Sprintf(`location.hash.startsWith("#/pipelines/") && !location.hash.endsWith(%q) &&
		document.querySelector("#mesh-status") && document.querySelector("#mesh-status").dataset.status === "succeeded"`, dead))
	shots.Shot(bctx, "06-requeued")
	newID := strings.TrimPrefix(browsertest.Eval[string](t, bctx, `decodeURIComponent(location.hash)`), "#/pipelines/")
	row := final(newID)
	require.Equal(t, dead, row.ParentID)
	require.Equal(t, tracing.MeshSucceeded, row.Status)
	old, _, err := l.srv.Log().MeshEnvelope(ctx, dead)
	require.NoError(t, err)
	require.Equal(t, tracing.MeshFailed, old.Status, "the dead envelope stays finished")
}
