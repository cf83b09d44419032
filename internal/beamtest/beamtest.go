package beamtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	binPath  string
	buildErr error
	binDir   string
)

// Main builds the beam binary, runs the tests and removes the binary. Use it
// as the body of TestMain.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "beamtest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "beamtest:", err)
		return 1
	}
	binDir = dir
	defer os.RemoveAll(dir)
	return m.Run()
}

var buildOnce sync.Once

// Binary returns the path of the beam binary built for this test run.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir == "" {
			buildErr = errors.New("beamtest.Main was not called from TestMain")
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		out := filepath.Join(binDir, "beam")
		args := []string{"build", "-o", out}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "./cmd/beam")
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build beam: %v\n%s", err, b)
			return
		}
		binPath = out
	})
	require.NoError(t, buildErr)
	return binPath
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// Process is a running `beam serve`.
type Process struct {
	t       testing.TB
	DataDir string
	Args    []string
	Env     []string

	mu  sync.Mutex
	cmd *exec.Cmd
	url string
	// intentURL is the Intent Protocol listener's base URL ("" when off).
	intentURL string
	// fedLine is the "federation: DOMAIN=nats://HOST:PORT#KEY" line's peer
	// line, with the port the NATS server bound ("" when federation is off).
	fedLine string
	output  *lockedBuffer
	// log is the test's output, where every line the process prints goes
	// too, prefixed with its name.
	log  io.Writer
	done chan struct{}
	err  error
}

// Options configure Start.
type Options struct {
	// DataDir is reused when set (restart tests); a fresh temporary
	// directory otherwise.
	DataDir string
	// Args are extra flags for `beam serve`.
	Args []string
	// Env holds extra KEY=VALUE environment entries.
	Env []string
	// Name prefixes the process's lines in the test's output; default the
	// --node-id in Args, or "serve".
	Name string
}

// newProcess is the process of opts, not started yet: its output goes to
// the test's output until the test's cleanups stop it, the process first.
func newProcess(t testing.TB, o Options) *Process {
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	name := o.Name
	for i, a := range o.Args {
		if a == "--node-id" && i+1 < len(o.Args) && name == "" {
			name = o.Args[i+1]
		}
	}
	if name == "" {
		name = "serve"
	}
	p := &Process{t: t, DataDir: o.DataDir, Args: o.Args, Env: o.Env, output: &lockedBuffer{}, log: LogWriter(t, name+": ")}
	t.Cleanup(p.Kill)
	return p
}

// Start runs `beam serve` on a random loopback port and waits until it
// serves. The process is stopped when the test ends.
func Start(t testing.TB, opts Options) *Process {
	t.Helper()
	p := newProcess(t, opts)
	p.start()
	return p
}

func (p *Process) start() {
	p.t.Helper()
	require.NoError(p.t, p.run())
}

// run starts the process and waits until it serves and is healthy.
func (p *Process) run() error {
	// The intent bus listens on a random port too unless Args say otherwise
	// (a later flag wins).
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--intent-listen", "127.0.0.1:0", "--data-dir", p.DataDir}, p.Args...)
	cmd := exec.Command(Binary(p.t), args...)
	cmd.Env = append(os.Environ(), p.Env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = io.MultiWriter(p.output, p.log)
	if err := cmd.Start(); err != nil {
		return err
	}

	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			p.output.Write([]byte(line + "\n"))
			_, _ = p.log.Write([]byte(line + "\n"))
			if rest, ok := strings.CutPrefix(line, "intent bus serving on "); ok {
				p.mu.Lock()
				p.intentURL = strings.TrimSpace(rest)
				p.mu.Unlock()
			}
			if rest, ok := strings.CutPrefix(line, "federation: "); ok {
				p.mu.Lock()
				p.fedLine = strings.TrimSpace(rest)
				p.mu.Unlock()
			}
			if rest, ok := strings.CutPrefix(line, "beam serving on "); ok {
				select {
				case urlc <- strings.TrimSpace(rest):
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()

	select {
	case u := <-urlc:
		p.mu.Lock()
		p.url = u
		p.mu.Unlock()
	case <-done:
		return fmt.Errorf("beam serve exited before serving; output:\n%s", p.output.String())
	case <-time.After(startTimeout):
		return fmt.Errorf("beam serve did not report its address within %s; output:\n%s", startTimeout, p.output.String())
	}
	return p.waitHealthy()
}

// startTimeout bounds how long a start may take to print its address.
const startTimeout = 60 * time.Second

func (p *Process) waitHealthy() error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(p.URL() + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("beam serve never became healthy")
}

// StartAll runs one `beam serve` per options at the same time and waits
// until all serve (nodes of a cluster wait for each other at start). The
// processes are stopped when the test ends.
func StartAll(t testing.TB, opts ...Options) []*Process {
	t.Helper()
	ps := make([]*Process, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		if o.Name == "" && !slices.Contains(o.Args, "--node-id") {
			o.Name = fmt.Sprintf("serve%d", i)
		}
		p := newProcess(t, o)
		ps[i] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.run()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "process %d", i)
	}
	return ps
}

// URL is the base URL of the running process, e.g. http://127.0.0.1:41234.
func (p *Process) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.url
}

// IntentURL is the base URL of the process's Intent Protocol listener.
func (p *Process) IntentURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.intentURL
}

// FederationLine is the peer line the process printed for itself
// (DOMAIN=nats://HOST:PORT#KEY, with the NATS port it bound, so a test can
// start it with --nats-listen 127.0.0.1:0); "" when federation is off.
func (p *Process) FederationLine() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fedLine
}

// Output returns what the process printed so far.
func (p *Process) Output() string { return p.output.String() }

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL)
}

// Stop sends SIGTERM and waits for a graceful exit, failing the test if the
// process does not exit cleanly.
func (p *Process) Stop() {
	p.t.Helper()
	p.signal(syscall.SIGTERM)
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	require.NoError(p.t, err, "beam serve did not exit cleanly; output:\n%s", p.output.String())
}

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts the process again on the same data directory (after Kill
// or Stop) and waits until it serves.
func (p *Process) Restart() {
	p.t.Helper()
	p.Kill()
	p.start()
}

// Run executes a beam subcommand (not serve) to completion and returns its
// combined output.
func Run(t testing.TB, ctx context.Context, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, Binary(t), args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
