// Command profserve runs a beam directory exactly as `beam serve` does, plus
// net/http/pprof on a separate loopback listener, so that the directory can
// be profiled under `beam bench --url … --server-pid …` before the operator
// pprof endpoint exists. It is a measuring tool, not a way to run beam.
//
//	go run ./internal/bench/profserve --data-dir /tmp/d --pprof 127.0.0.1:6060
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/beamdir/beam/internal/server"
)

func main() {
	dataDir := flag.String("data-dir", "", "data directory (required)")
	listen := flag.String("listen", "127.0.0.1:0", "directory listen address")
	pprofAddr := flag.String("pprof", "127.0.0.1:6060", "pprof listen address (loopback)")
	sync := flag.String("sqlite-synchronous", "FULL", "SQLite synchronous mode")
	flag.Parse()
	if err := run(*dataDir, *listen, *pprofAddr, *sync); err != nil {
		fmt.Fprintln(os.Stderr, "profserve:", err)
		os.Exit(1)
	}
}

func run(dataDir, listen, pprofAddr, sync string) error {
	if dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := server.New(ctx, server.Config{DataDir: dataDir, Synchronous: sync, Logger: logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	pln, err := net.Listen("tcp", pprofAddr)
	if err != nil {
		return fmt.Errorf("pprof listen: %w", err)
	}
	psrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = psrv.Serve(pln) }()
	fmt.Printf("beam serving on http://%s\npprof on http://%s/debug/pprof/\npid %d\n", ln.Addr(), pln.Addr(), os.Getpid())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	_ = psrv.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
