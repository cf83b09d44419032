package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ServerOptions configure StartServer.
type ServerOptions struct {
	// Binary is the beam executable (os.Executable() for beam bench).
	Binary string
	// DataDir is the server's --data-dir; it must exist.
	DataDir string
	// Synchronous is passed as --sqlite-synchronous when set.
	Synchronous string
	// Args are extra flags for beam serve.
	Args []string
	// Env holds extra KEY=VALUE environment entries.
	Env []string
	// Output receives the server's stderr and stdout lines; nil discards.
	Output io.Writer
	// StartTimeout bounds the wait for /health to answer 200 (default 60 s).
	StartTimeout time.Duration
	// Listen is the --listen address (default 127.0.0.1:0, a free port). A
	// fixed address lets a restarted server keep its URL.
	Listen string
}

// ServerProcess is a `beam serve` child process.
type ServerProcess struct {
	// URL is the base URL it serves on, e.g. http://127.0.0.1:41234.
	URL string
	// PID is its process id.
	PID int
	// Ready is how long it took from exec to the first /health 200.
	Ready time.Duration
	// IntentURL is the Intent Protocol listener's base URL, when beam serve
	// printed one (it does before "beam serving on").
	IntentURL string
	// OperatorToken is the operator token beam serve stored in its data
	// directory (admin.token), empty when it could not be read.
	OperatorToken string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
	once sync.Once
}

// servingPrefix starts the line beam serve prints once it listens.
const servingPrefix = "beam serving on "

// StartServer runs `beam serve --listen LISTEN --data-dir DIR` and
// returns once /health answers 200.
func StartServer(ctx context.Context, opts ServerOptions) (*ServerProcess, error) {
	if opts.Binary == "" || opts.DataDir == "" {
		return nil, errors.New("start server: binary and data directory are required")
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	out := opts.Output
	if out == nil {
		out = io.Discard
	}
	listen := opts.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	// A load test measures the directory, not its limits: every client
	// comes from one address (or a few loopback ones), and an idle agents
	// run holds far more connections than the default cap. The Intent Protocol listener is off unless
	// Args turn it on (a later flag wins), so that several servers never
	// contend for its port.
	args := []string{"serve", "--listen", listen, "--intent-listen=", "--data-dir", opts.DataDir, "--no-rate-limits", "--max-conns-per-addr", "0", "--max-conns", "0",
		"--intent-max-conns", "0", "--intent-max-conns-per-addr", "0"}
	if opts.Synchronous != "" {
		args = append(args, "--sqlite-synchronous", opts.Synchronous)
	}
	args = append(args, opts.Args...)
	cmd := exec.Command(opts.Binary, args...)
	cmd.Env = append(os.Environ(), opts.Env...)
	tail := &tailBuffer{}
	cmd.Stderr = &lockedWriter{w: io.MultiWriter(out, tail)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	p := &ServerProcess{PID: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, "intent bus serving on "); ok {
				p.IntentURL = strings.TrimSpace(rest)
				continue
			}
			if rest, ok := strings.CutPrefix(line, servingPrefix); ok {
				select {
				case urlc <- strings.TrimSpace(rest):
				default:
				}
				continue
			}
			if !strings.HasPrefix(line, "operator token") {
				fmt.Fprintln(cmd.Stderr, line)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	deadline := time.NewTimer(opts.StartTimeout)
	defer deadline.Stop()
	select {
	case p.URL = <-urlc:
	case <-p.done:
		return nil, fmt.Errorf("start server: beam serve exited before serving: %v\n%s", p.err, tail.String())
	case <-deadline.C:
		_ = p.Stop(context.Background())
		return nil, fmt.Errorf("start server: no %q line within %v", servingPrefix, opts.StartTimeout)
	case <-ctx.Done():
		_ = p.Stop(context.Background())
		return nil, fmt.Errorf("start server: %w", ctx.Err())
	}
	if err := waitHealthy(ctx, p.URL, p.done, time.Until(began.Add(opts.StartTimeout))); err != nil {
		_ = p.Stop(context.Background())
		return nil, fmt.Errorf("start server: %w", err)
	}
	p.Ready = time.Since(began)
	if tok, err := os.ReadFile(filepath.Join(opts.DataDir, "admin.token")); err == nil {
		p.OperatorToken = strings.TrimSpace(string(tok))
	}
	return p, nil
}

// waitHealthy polls base/health until it answers 200, the process exits
// or within passes.
func waitHealthy(ctx context.Context, base string, exited <-chan struct{}, within time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(within)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponse))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s/health did not answer 200 within %v", base, within)
		}
		select {
		case <-exited:
			return errors.New("server exited before it was healthy")
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Stop sends SIGTERM and waits for the process to exit (killing it if ctx
// ends first, or after 30 s).
func (p *ServerProcess) Stop(ctx context.Context) error {
	var err error
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(30 * time.Second)
		defer t.Stop()
		select {
		case <-p.done:
			var ee *exec.ExitError
			if p.err != nil && !errors.As(p.err, &ee) {
				err = p.err
			}
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			<-p.done
			err = fmt.Errorf("stop server: %w", ctx.Err())
		case <-t.C:
			_ = p.cmd.Process.Kill()
			<-p.done
			err = errors.New("stop server: killed after 30s without exiting")
		}
	})
	return err
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *ServerProcess) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Exited is closed once the process has exited.
func (p *ServerProcess) Exited() <-chan struct{} { return p.done }

// tailBuffer keeps the last tailBytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 4096

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > tailBytes {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailBytes:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// lockedWriter serializes writes from the process's two output streams.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
