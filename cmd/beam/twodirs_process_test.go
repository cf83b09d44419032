package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// freePortWithIntent returns a free port p (freePort) whose job-bus
// default, p + 100, is free and below the ephemeral range as well, and
// reserves both.
func freePortWithIntent(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := freePort(t)
		testPorts.Lock()
		// p + 100 below the ephemeral range too (see freePort).
		taken := testPorts.used[p+intentPortOffset] || p+intentPortOffset >= testPorts.hi
		testPorts.used[p+intentPortOffset] = true
		testPorts.Unlock()
		if taken {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+intentPortOffset))
		if err != nil {
			continue
		}
		require.NoError(t, ln.Close())
		return p
	}
	t.Fatal("no free port pair")
	return 0
}

// TestTwoDirectoriesSideBySide starts two beam serve processes on one
// machine with nothing but --listen and --data-dir: both serve, each with
// its job bus on its own port + 100.
func TestTwoDirectoriesSideBySide(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range []string{"alpha", "beta"} {
		port := freePortWithIntent(t)
		listen := fmt.Sprintf("127.0.0.1:%d", port)
		cmd := exec.CommandContext(ctx, beamtest.Binary(t), "serve", "--listen", listen, "--data-dir", filepath.Join(t.TempDir(), name))
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		logPath := filepath.Join(t.TempDir(), name+".log")
		logFile, err := os.Create(logPath)
		require.NoError(t, err)
		defer logFile.Close()
		cmd.Stderr = logFile
		logs := func() string { b, _ := os.ReadFile(logPath); return string(b) }
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		lines := make(chan string, 64)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
			exited <- cmd.Wait()
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		intent := ""
	wait:
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("%s exited before serving:\n%s", name, logs())
				}
				if rest, found := strings.CutPrefix(line, "intent bus serving on "); found {
					intent = rest
				}
				if strings.HasPrefix(line, "beam serving on ") {
					break wait
				}
			case <-ctx.Done():
				t.Fatalf("%s did not serve:\n%s", name, logs())
			}
		}
		require.Equal(t, fmt.Sprintf("http://127.0.0.1:%d", port+intentPortOffset), intent, name)
		for _, u := range []string{"http://" + listen + "/health", intent + "/health"} {
			require.Eventually(t, func() bool {
				resp, err := http.Get(u)
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			}, 30*time.Second, 20*time.Millisecond, u)
		}
	}
}

func TestIntentListenDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ listen, intent, want, err string }{
		{"127.0.0.1:3100", "auto", "127.0.0.1:3200", ""},
		{"127.0.0.1:3101", "auto", "127.0.0.1:3201", ""},
		{"0.0.0.0:8080", "auto", "0.0.0.0:8180", ""},
		{"[::1]:3100", "auto", "[::1]:3200", ""},
		{"127.0.0.1:0", "auto", "127.0.0.1:0", ""},
		{"127.0.0.1:3100", "", "", ""},
		{"127.0.0.1:3100", "127.0.0.1:9999", "127.0.0.1:9999", ""},
		{"127.0.0.1:65500", "auto", "", "out of range; set --intent-listen"},
		{"127.0.0.1:http", "auto", "", "needs a numeric port; set --intent-listen"},
	} {
		got, err := intentListenAddr(c.listen, c.intent)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.listen)
			continue
		}
		require.NoError(t, err, c.listen)
		require.Equal(t, c.want, got, c.listen)
	}
}
