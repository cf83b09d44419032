package demo

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/bus/jobs"
)

// The demo's share of the job bus and of pipelines: a shop publishes jobs
// that a worker claims and fulfills (or fails), and procurement runs
// orders through a pipeline of the demo agents.

// jobNamespace is the job bus namespace the demo publishes in.
const jobNamespace = "shop"

// approvalLimitEur is the largest order Finance approves in a pipeline;
// larger ones fail their hop for good.
const approvalLimitEur = 50000

// jobBus calls the Intent Protocol job bus with BUS_SECRET, signing every
// request as the Python SDK does.
type jobBus struct {
	base, key string
	http      *http.Client
}

// do sends one request and decodes a JSON answer into out (when not nil).
// It returns the status code.
func (b *jobBus) do(ctx context.Context, method, path, query string, in, out any) (int, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, fmt.Errorf("job bus %s %s: %w", method, path, err)
		}
	}
	u := b.base + path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("job bus %s %s: %w", method, path, err)
	}
	var nb [16]byte
	_, _ = crand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-KEY", b.key)
	req.Header.Set("X-Timestamp", ts)
	req.Header.Set("X-Nonce", nonce)
	req.Header.Set("X-Signature", jobs.Sign(b.key, jobs.CanonicalString(method, path, query, ts, nonce, body)))
	resp, err := b.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("job bus %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("job bus %s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("job bus %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// claimed is a job a worker holds.
type claimed struct {
	ID         string `json:"id"`
	Goal       string `json:"goal"`
	ClaimToken string `json:"claim_token"`
}

func (b *jobBus) publish(ctx context.Context, goal string, payload any, maxAttempts int) (string, error) {
	body := map[string]any{"goal": goal, "payload": payload, "namespace": jobNamespace}
	if maxAttempts > 0 {
		body["max_attempts"] = maxAttempts
	}
	var out struct {
		ID string `json:"id"`
	}
	_, err := b.do(ctx, http.MethodPost, "/intent", "", body, &out)
	return out.ID, err
}

// claim claims the next job of goal ("" any); nil when none is open.
func (b *jobBus) claim(ctx context.Context, goal string) (*claimed, error) {
	q := "namespace=" + jobNamespace
	if goal != "" {
		q += "&goal=" + goal
	}
	var c claimed
	st, err := b.do(ctx, http.MethodPost, "/claim", q, nil, &c)
	if err != nil || st == http.StatusNoContent || c.ID == "" {
		return nil, err
	}
	return &c, nil
}

func (b *jobBus) fulfill(ctx context.Context, c *claimed, result any) error {
	_, err := b.do(ctx, http.MethodPost, "/fulfill/"+c.ID, "", map[string]any{"claim_token": c.ClaimToken, "result": result}, nil)
	return err
}

func (b *jobBus) fail(ctx context.Context, c *claimed, reason string) error {
	_, err := b.do(ctx, http.MethodPost, "/fail/"+c.ID, "", map[string]any{"claim_token": c.ClaimToken, "error": reason}, nil)
	return err
}

// seedJobs fills the shop's queue with every status: fulfilled jobs, a
// claimed one, open ones and a dead letter.
func (b *jobBus) seed(ctx context.Context) error {
	for i, goal := range []string{"invoice.send", "invoice.send", "parcel.ship", "parcel.ship", "customer.notify", "customer.notify"} {
		if _, err := b.publish(ctx, goal, map[string]any{"order": fmt.Sprintf("SO-%04d", 1001+i)}, 0); err != nil {
			return err
		}
	}
	for range 3 {
		c, err := b.claim(ctx, "")
		if err != nil || c == nil {
			return err
		}
		if err := b.fulfill(ctx, c, map[string]any{"done": true, "by": "shop-worker-1"}); err != nil {
			return err
		}
	}
	// One stays claimed (until its lease runs out and it is open again).
	if _, err := b.claim(ctx, "parcel.ship"); err != nil {
		return err
	}
	// An SMS whose carrier is down: one attempt, then dead.
	if _, err := b.publish(ctx, "sms.send", map[string]any{"to": "+49 30 1234567", "text": "Your order shipped"}, 1); err != nil {
		return err
	}
	c, err := b.claim(ctx, "sms.send")
	if err != nil || c == nil {
		return err
	}
	return b.fail(ctx, c, "carrier down")
}

// jobCycle publishes one job and lets a worker take the oldest open one:
// most are fulfilled, some fail and come back with a backoff.
func (b *jobBus) cycle(ctx context.Context, rng *rand.Rand) error {
	goals := []string{"invoice.send", "parcel.ship", "customer.notify"}
	if _, err := b.publish(ctx, goals[rng.IntN(len(goals))], map[string]any{"order": fmt.Sprintf("SO-%04d", 2000+rng.IntN(8000))}, 0); err != nil {
		return err
	}
	c, err := b.claim(ctx, "")
	if err != nil || c == nil {
		return err
	}
	if rng.IntN(5) == 0 {
		return b.fail(ctx, c, "printer jammed")
	}
	return b.fulfill(ctx, c, map[string]any{"done": true, "by": "shop-worker-1"})
}

// meshHandlers makes the connected demo agents pipeline actors: the
// warehouse reserves stock, finance approves (refusing large orders), the
// partner desk confirms.
func meshHandlers(c map[string]*agents.Client) {
	step := func(actor, key string, value any, check func(order map[string]any) error) agents.MeshHandler {
		return func(ctx context.Context, h *agents.MeshHop) (any, error) {
			order := map[string]any{}
			if err := h.Bind(&order); err != nil {
				return nil, agents.MeshPermanent(err)
			}
			if secs, _ := order["reviewSeconds"].(float64); secs > 0 && actor == finance {
				// A slow review: the envelope stays running for a while.
				select {
				case <-time.After(time.Duration(min(secs, 20) * float64(time.Second))):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			if check != nil {
				if err := check(order); err != nil {
					return nil, agents.MeshPermanent(err)
				}
			}
			order[key] = value
			return order, nil
		}
	}
	c[warehouse].HandleMesh(step(warehouse, "reserved", "aisle 7, pallet 3", nil))
	c[finance].HandleMesh(step(finance, "approved", true, func(o map[string]any) error {
		if amt, _ := o["amountEur"].(float64); amt > approvalLimitEur {
			return fmt.Errorf("%.0f EUR is over the approval limit of %d EUR", amt, approvalLimitEur)
		}
		return nil
	}))
	c[partnerDesk].HandleMesh(step(partnerDesk, "confirmation", "PD-7731", nil))
}

// orderRoute is the route of a demo order.
var orderRoute = []string{warehouse, finance, partnerDesk}

// createOrder starts an order pipeline as procurement.
func createOrder(ctx context.Context, base string, c *agents.Client, order map[string]any) (string, error) {
	body, err := json.Marshal(map[string]any{"route": orderRoute, "payload": order})
	if err != nil {
		return "", fmt.Errorf("demo pipeline: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/api/v1/mesh", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("demo pipeline: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", c.APIKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("demo pipeline: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("demo pipeline: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", fmt.Errorf("demo pipeline: %w", err)
	}
	return out.ID, nil
}

// seedOrders starts a few orders: most go through, one is over the
// approval limit and fails, one waits in a long review.
func seedOrders(ctx context.Context, base string, c *agents.Client) error {
	for i, o := range []map[string]any{
		{"order": "PO-3101", "sku": "INV-240", "quantity": 12, "amountEur": 2208},
		{"order": "PO-3102", "sku": "INV-118", "quantity": 40, "amountEur": 7360},
		{"order": "PO-3103", "sku": "INV-240", "quantity": 400, "amountEur": 73600},
		{"order": "PO-3104", "sku": "INV-502", "quantity": 5, "amountEur": 920, "reviewSeconds": 20},
	} {
		if _, err := createOrder(ctx, base, c, o); err != nil {
			return fmt.Errorf("order %d: %w", i, err)
		}
	}
	return nil
}

// startWork seeds the job bus and the pipelines once per state directory
// (a restart finds them in the log); failures are logged, not fatal: the
// directory's own demo traffic goes on without them.
func startWork(ctx context.Context, lg *slog.Logger, cfg Config, bus *jobBus, procurement *agents.Client) {
	marker := filepath.Join(cfg.StateDir, "seeded")
	if _, err := os.Stat(marker); err == nil {
		return
	}
	defer func() {
		if err := os.WriteFile(marker, []byte("jobs and pipelines seeded\n"), 0o600); err != nil {
			lg.Warn("demo seed marker not written", "err", err)
		}
	}()
	if bus != nil {
		if err := bus.seed(ctx); err != nil && !errors.Is(err, context.Canceled) {
			lg.Warn("demo jobs not seeded", "err", err)
		}
	}
	if err := seedOrders(ctx, cfg.DirectoryURL, procurement); err != nil && !errors.Is(err, context.Canceled) {
		lg.Warn("demo pipelines not started", "err", err)
	}
}
