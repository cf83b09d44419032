package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/beamdir/beam/agents"
)

// The demo agents. They share the org "demo", so the default same-org policy
// lets them talk to each other.
const (
	procurement = "procurement@demo.beam.directory"
	partnerDesk = "partner-desk@demo.beam.directory"
	finance     = "finance@demo.beam.directory"
	warehouse   = "warehouse@demo.beam.directory"
	archive     = "archive@demo.beam.directory" // never connects
)

// Config configures Run.
type Config struct {
	// DirectoryURL is the base URL of the directory, e.g. http://127.0.0.1:3100.
	DirectoryURL string
	// StateDir keeps the agents' identities across restarts (their API keys
	// prove ownership when they register again).
	StateDir string
	// Interval is the mean time between two demo intents (default 1.5 s).
	Interval time.Duration
	// Logger receives the demo's diagnostics.
	Logger *slog.Logger
	// JobBusURL is the base URL of the Intent Protocol job bus and
	// JobBusKey its BUS_SECRET; without them the demo publishes no jobs.
	JobBusURL string
	JobBusKey string
}

// Run registers and connects the demo agents, then keeps sending intents
// until ctx ends. It returns nil when ctx is cancelled.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Interval <= 0 {
		cfg.Interval = 1500 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	lg := cfg.Logger.With("component", "demo")
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("demo state directory: %w", err)
	}
	clients := map[string]*agents.Client{}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for _, a := range []struct{ id, name string }{
		{procurement, "Procurement"}, {partnerDesk, "Partner desk"}, {finance, "Finance"},
		{warehouse, "Warehouse"}, {archive, "Archive (offline)"},
	} {
		c, err := register(ctx, cfg, a.id, a.name)
		if err != nil {
			return err
		}
		clients[a.id] = c
	}
	// Procurement registered first and owns the org: it approves the
	// others, so the default same-org policy lets them talk.
	owner := clients[procurement].APIKey()
	for _, id := range []string{partnerDesk, finance, warehouse, archive} {
		if err := approve(ctx, cfg.DirectoryURL, owner, id); err != nil {
			lg.Warn("demo agent not approved; same-org intents to and from it are refused", "err", err)
		}
	}
	handlers(clients)
	meshHandlers(clients)
	for _, id := range []string{procurement, partnerDesk, finance, warehouse} {
		if err := clients[id].Connect(ctx); err != nil {
			return fmt.Errorf("demo agent %s: connect: %w", id, err)
		}
	}
	lg.Info("demo agents connected", "agents", len(clients)-1, "offline", archive)
	var bus *jobBus
	if cfg.JobBusURL != "" && cfg.JobBusKey != "" {
		bus = &jobBus{base: strings.TrimRight(cfg.JobBusURL, "/"), key: cfg.JobBusKey, http: &http.Client{Timeout: 15 * time.Second}}
	}
	startWork(ctx, lg, cfg, bus, clients[procurement])

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	tick := time.NewTimer(cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		n := rng.IntN(12)
		switch {
		case n == 10 && bus != nil:
			go func(r *rand.Rand) {
				if err := bus.cycle(ctx, r); err != nil && ctx.Err() == nil {
					lg.Debug("demo job ended with an error", "err", err)
				}
			}(rand.New(rand.NewPCG(rng.Uint64(), 11)))
		case n == 11:
			order := map[string]any{"order": fmt.Sprintf("PO-%d", 4000+rng.IntN(6000)), "sku": "INV-240", "quantity": 1 + rng.IntN(60)}
			order["amountEur"] = 184 * order["quantity"].(int)
			go func() {
				if _, err := createOrder(ctx, cfg.DirectoryURL, clients[procurement], order); err != nil && ctx.Err() == nil {
					lg.Debug("demo pipeline ended with an error", "err", err)
				}
			}()
		default:
			go scenario(ctx, lg, clients, n%10)
		}
		// Exponentially distributed gaps look like real traffic.
		tick.Reset(time.Duration(rng.ExpFloat64() * float64(cfg.Interval)))
	}
}

// register loads or creates the identity of id and registers it.
func register(ctx context.Context, cfg Config, id, name string) (*agents.Client, error) {
	path := filepath.Join(cfg.StateDir, id+".json")
	ident, err := agents.LoadIdentity(path)
	if errors.Is(err, os.ErrNotExist) {
		ident, err = agents.GenerateIdentity(id)
	}
	if err != nil {
		return nil, fmt.Errorf("demo agent %s: identity: %w", id, err)
	}
	c, err := agents.NewClient(agents.ClientConfig{
		DirectoryURL: cfg.DirectoryURL, Identity: ident, APIKey: ident.APIKey, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("demo agent %s: %w", id, err)
	}
	res, err := c.Register(ctx, name, []string{"demo"})
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("demo agent %s: %w", id, err)
	}
	if res.APIKey != "" {
		ident.APIKey = res.APIKey
		if err := ident.Save(path); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("demo agent %s: save identity: %w", id, err)
		}
	}
	return c, nil
}

// handlers gives each connected agent its behaviour.
func handlers(c map[string]*agents.Client) {
	c[partnerDesk].Handle("quote.request", func(_ context.Context, in *agents.Intent) agents.Reply {
		var req struct {
			SKU      string `json:"sku"`
			Quantity int    `json:"quantity"`
		}
		if err := in.Bind(&req); err != nil || req.Quantity <= 0 {
			return agents.Failure("INVALID_QUOTE", "quantity must be positive")
		}
		return agents.Success(map[string]any{"sku": req.SKU, "unitPriceEur": 184, "totalPriceEur": 184 * req.Quantity})
	})
	c[warehouse].Handle("inventory.check", func(_ context.Context, in *agents.Intent) agents.Reply {
		var req struct {
			SKU string `json:"sku"`
		}
		_ = in.Bind(&req)
		if req.SKU == "INV-404" {
			return agents.Failure("OUT_OF_STOCK", "no units of "+req.SKU+" in any warehouse")
		}
		return agents.Success(map[string]any{"sku": req.SKU, "available": true, "shipWindow": "Thu 08:00-12:00 CET"})
	})
	c[finance].Handle("purchase.preflight", func(_ context.Context, _ *agents.Intent) agents.Reply {
		return agents.Accept() // reviewed later: delivered, not yet acked
	})
	c[finance].Handle("conversation.message", func(_ context.Context, in *agents.Intent) agents.Reply {
		var m struct {
			Message string `json:"message"`
		}
		_ = in.Bind(&m)
		return agents.Success(map[string]any{"message": "Finance here: noted \"" + m.Message + "\""})
	})
}

// scenario sends one demo intent; n picks which.
func scenario(ctx context.Context, lg *slog.Logger, c map[string]*agents.Client, n int) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var err error
	switch {
	case n < 3:
		_, err = c[procurement].Send(ctx, partnerDesk, "quote.request", map[string]any{"sku": "INV-240", "quantity": 1 + n*40})
	case n < 5:
		sku := "INV-240"
		if n == 4 {
			sku = "INV-404" // fails: out of stock
		}
		_, err = c[procurement].Send(ctx, warehouse, "inventory.check", map[string]any{"sku": sku})
	case n < 7:
		_, err = c[procurement].Send(ctx, finance, "purchase.preflight", map[string]any{"amountEur": 44160, "supplier": partnerDesk})
	case n < 8:
		_, err = c[warehouse].Send(ctx, finance, "conversation.message", map[string]any{"message": "pallets shipped"})
	case n < 9:
		_, err = c[partnerDesk].Send(ctx, "echo@beam.directory", "conversation.message", map[string]any{"message": "ping"})
	default:
		// The archive never connects: the bus keeps the message in its inbox.
		_, err = c[procurement].SendDurable(ctx, archive, "conversation.message", map[string]any{"message": "file the Q3 quotes"}, nil)
	}
	if err != nil && ctx.Err() == nil {
		lg.Debug("demo intent ended with an error", "err", err)
	}
}

// approve makes id an approved member of the demo org with the owner's API
// key. An agent that already owns the org (a data directory upgraded from
// before org approval) needs no approval.
func approve(ctx context.Context, base, ownerKey, id string) error {
	u := strings.TrimRight(base, "/") + "/orgs/demo/members/" + url.PathEscape(id) + "/approve"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return fmt.Errorf("demo agent %s: approve: %w", id, err)
	}
	req.Header.Set("X-Api-Key", ownerKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("demo agent %s: approve: %w", id, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
		return fmt.Errorf("demo agent %s: approve: HTTP %d: %s", id, resp.StatusCode, body)
	}
	return nil
}
