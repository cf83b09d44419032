package beam

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/internal/limits"
)

// intentBus is the Intent Protocol job bus and its own HTTP server.
type intentBus struct {
	svc         *jobs.Service
	srv         *http.Server
	secret      string
	secretIsNew bool
}

func (s *Server) openIntentBus(ctx context.Context) error {
	if !s.cfg.JobBus.Enabled {
		return nil
	}
	cfg := s.cfg.JobBus.Settings
	secret, isNew, err := loadToken(s.cfg.DataDir, "intent.secret", "ibs_", cfg.Secret)
	if err != nil {
		return err
	}
	cfg.Secret = secret
	cfg.Log = s.log
	if cfg.Clock == nil {
		cfg.Clock = s.cfg.Clock
	}
	if cfg.Logger == nil {
		cfg.Logger = s.logger
	}
	svc, err := jobs.Open(ctx, cfg)
	if err != nil {
		if isNew {
			// Never printed: the next start generates and prints one.
			_ = os.Remove(filepath.Join(s.cfg.DataDir, "intent.secret"))
		}
		return fmt.Errorf("open intent bus: %w", err)
	}
	if s.dash != nil {
		s.dash.SetJobs(svc)
	}
	idle := cmp.Or(s.cfg.Limits.JobBusIdleTimeout, 2*time.Minute)
	handler := svc.Handler()
	if s.cluster != nil {
		// One node, the home, serves the job bus; the others forward.
		handler = s.cluster.JobsHandler(handler, jobs.WriteProblem)
	}
	s.intent = &intentBus{svc: svc, secret: secret, secretIsNew: isNew, srv: &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(idle, defaultReadHeaderTimeout),
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       idle,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}}
	return nil
}

// JobBus is the job bus, or nil when Config.JobBus is not enabled, for
// programs and tests that reach its jobs in process.
func (s *Server) JobBus() *jobs.Service {
	if s.intent == nil {
		return nil
	}
	return s.intent.svc
}

// ServeJobBus answers the Intent Protocol job bus on ln until Shutdown,
// under Limits' job bus connection caps; it returns nil after a graceful
// shutdown, and an error when Config.JobBus is not enabled.
func (s *Server) ServeJobBus(ln net.Listener) error {
	if s.intent == nil {
		return errors.New("intent bus is off")
	}
	if lim := s.cfg.Limits; lim.JobBusMaxConns > 0 || lim.JobBusMaxConnsPerAddr > 0 {
		ln = limits.NewListener(ln, lim.JobBusMaxConns, lim.JobBusMaxConnsPerAddr)
	}
	err := s.intent.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) closeIntentBus(ctx context.Context) error {
	if s.intent == nil {
		return nil
	}
	var errs []error
	if err := s.intent.srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("intent bus http shutdown: %w", err))
	}
	if err := s.intent.svc.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close intent bus: %w", err))
	}
	return errors.Join(errs...)
}
