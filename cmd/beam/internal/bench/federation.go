package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"
)

// FederationOptions configure StartFederation.
type FederationOptions struct {
	// Server holds what both processes share (Binary, Synchronous, Args,
	// Output, StartTimeout); its DataDir and Listen are ignored.
	Server ServerOptions
	// DataDir and PeerDataDir are the two processes' data directories;
	// both must exist.
	DataDir, PeerDataDir string
	// Domain and PeerDomain are their federation domains (defaults
	// alpha.beam.directory and beta.beam.directory).
	Domain, PeerDomain string
}

// StartFederation starts two `beam serve` processes with embedded NATS on
// free loopback ports, each pinning the other as printed by `beam peer
// show-self`, and with --default-policy allow so that agents of one
// directory may send to agents of the other. It returns once both serve.
func StartFederation(ctx context.Context, opts FederationOptions) (*ServerProcess, *ServerProcess, error) {
	if opts.Domain == "" {
		opts.Domain = "alpha.beam.directory"
	}
	if opts.PeerDomain == "" {
		opts.PeerDomain = "beta.beam.directory"
	}
	if opts.DataDir == "" || opts.PeerDataDir == "" || opts.DataDir == opts.PeerDataDir {
		return nil, nil, errors.New("start federation: two distinct data directories are required")
	}
	natsA, err := freeLoopbackAddr()
	if err != nil {
		return nil, nil, err
	}
	natsB, err := freeLoopbackAddr()
	if err != nil {
		return nil, nil, err
	}
	lineA, err := showSelf(ctx, opts.Server.Binary, opts.DataDir, opts.Domain, natsA)
	if err != nil {
		return nil, nil, err
	}
	lineB, err := showSelf(ctx, opts.Server.Binary, opts.PeerDataDir, opts.PeerDomain, natsB)
	if err != nil {
		return nil, nil, err
	}
	start := func(dir, domain, nats, peer string) (*ServerProcess, error) {
		o := opts.Server
		o.DataDir, o.Listen = dir, ""
		o.Args = append([]string{"--domain", domain, "--nats-listen", nats, "--peer", peer, "--default-policy", "allow"}, o.Args...)
		return StartServer(ctx, o)
	}
	a, err := start(opts.DataDir, opts.Domain, natsA, lineB)
	if err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", opts.Domain, err)
	}
	b, err := start(opts.PeerDataDir, opts.PeerDomain, natsB, lineA)
	if err != nil {
		_ = a.Stop(context.Background())
		return nil, nil, fmt.Errorf("start %s: %w", opts.PeerDomain, err)
	}
	return a, b, nil
}

// showSelf runs `beam peer show-self` and returns its peer line.
func showSelf(ctx context.Context, bin, dir, domain, nats string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "peer", "show-self", "--data-dir", dir, "--domain", domain, "--nats-listen", nats).CombinedOutput()
	line := strings.TrimSpace(string(out))
	if err != nil {
		return "", fmt.Errorf("beam peer show-self --domain %s: %w: %.300s", domain, err, line)
	}
	if !strings.HasPrefix(line, domain+"=nats://") || strings.Contains(line, "\n") {
		return "", fmt.Errorf("beam peer show-self --domain %s printed %.300q, want one DOMAIN=nats://… line", domain, line)
	}
	return line, nil
}

// freeLoopbackAddr returns a loopback address whose port was free a moment
// ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	return addr, nil
}
