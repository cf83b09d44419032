package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// readmeSection returns the ```sh blocks of README.md between the heading
// start and the next line starting with end.
func readmeSection(t *testing.T, start, end string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	s := string(b)
	i := strings.Index(s, start)
	require.NotEqual(t, -1, i, "README has no %q", start)
	s = s[i:]
	if j := strings.Index(s, end); j > 0 {
		s = s[:j]
	}
	var blocks []string
	for {
		k := strings.Index(s, "```sh\n")
		if k < 0 {
			return blocks
		}
		s = s[k+len("```sh\n"):]
		e := strings.Index(s, "```")
		require.NotEqual(t, -1, e)
		blocks = append(blocks, s[:e])
		s = s[e:]
		s = s[3:]
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// TestReadmeFederationRunsAsWritten runs the shell blocks of the README's
// federation section, in order, with bash and the real binary, on random
// ports: servers and listeners go to the background, the directories must
// become healthy, and the final send must come back echoed.
func TestReadmeFederationRunsAsWritten(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	blocks := readmeSection(t, "## Federation", "**An existing NATS deployment**")
	require.Len(t, blocks, 2)
	ports := map[string]string{}
	for _, p := range []string{"3100", "3101", "3200", "3201", "4222", "4223"} {
		ports[p] = freePort(t)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	waitHealthy := func(port string) {
		fmt.Fprintf(&script, "for i in $(seq 300); do curl -sf http://127.0.0.1:%s/health >/dev/null && break; sleep 0.1; done\n", port)
	}
	n := 0
	for _, block := range blocks {
		for _, line := range strings.Split(block, "\n") {
			if c := strings.Index(line, "   # "); c >= 0 {
				line = line[:c]
			}
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			for from, to := range ports {
				line = strings.ReplaceAll(line, "127.0.0.1:"+from, "127.0.0.1:"+to)
			}
			switch {
			case strings.HasPrefix(line, "beam serve"):
				n++
				fmt.Fprintf(&script, "%s > serve%d.log 2>&1 &\n", line, n)
			case strings.HasPrefix(line, "beam listen"):
				fmt.Fprintf(&script, "%s > listen.log 2>&1 &\n", line)
				script.WriteString("for i in $(seq 300); do grep -q listening listen.log && break; sleep 0.1; done\n")
			default:
				if strings.HasPrefix(line, "beam register") || strings.HasPrefix(line, "beam keygen") {
					if n == 2 {
						waitHealthy(ports["3100"])
						waitHealthy(ports["3101"])
						n = 3
					}
				}
				script.WriteString(line + "\n")
			}
		}
	}
	require.Equal(t, 3, n, "the section starts two directories:\n%s", script.String())

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(beamtest.Binary(t))+":"+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The background servers and listener are in the script's process
	// group: stop them all when the test ends.
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	out, err := cmd.Output()
	logs := func() string {
		var b strings.Builder
		for _, f := range []string{"serve1.log", "serve2.log", "listen.log"} {
			data, _ := os.ReadFile(filepath.Join(dir, f))
			fmt.Fprintf(&b, "--- %s\n%s", f, data)
		}
		return b.String()
	}
	require.NoError(t, err, "script:\n%s\noutput:\n%s\n%s", script.String(), out, logs())
	require.Contains(t, string(out), `"payload":{"message":"Echo: hi b"}`, logs())
	require.Contains(t, string(out), `"allowed_from":"a@alpha.beam.directory"`)
	_, err = os.Stat(filepath.Join(dir, ".beam-agents", "a.json"))
	require.NoError(t, err)
}

// TestReadmeThreeTerminalsRunsAsWritten runs the README's three-terminal
// walk-through block as written with bash and the real binary: the
// directory on random ports (BEAM_URL points the agent commands at it),
// the listener in the background, and <nonce> replaced by the nonce of the
// last send.
func TestReadmeThreeTerminalsRunsAsWritten(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	blocks := readmeSection(t, "## Try it from three terminals", "\n## ")
	require.Len(t, blocks, 1)
	port, intentPort := freePort(t), freePort(t)
	var script strings.Builder
	script.WriteString("set -e\n")
	sends := 0
	for _, line := range strings.Split(blocks[0], "\n") {
		if c := strings.Index(line, "   # "); c >= 0 {
			line = line[:c]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "go build"):
			// The test has built the binary already.
		case line == "beam serve":
			fmt.Fprintf(&script, "beam serve --listen 127.0.0.1:%s --intent-listen 127.0.0.1:%s > serve.log 2>&1 &\n", port, intentPort)
			fmt.Fprintf(&script, "for i in $(seq 300); do curl -sf http://127.0.0.1:%s/health >/dev/null && break; sleep 0.1; done\n", port)
		case strings.HasPrefix(line, "beam listen"):
			fmt.Fprintf(&script, "%s > listen.log 2>&1 &\n", line)
			script.WriteString("for i in $(seq 300); do grep -q listening listen.log && break; sleep 0.1; done\n")
		case strings.HasPrefix(line, "beam send"):
			sends++
			fmt.Fprintf(&script, "out=$(%s)\necho \"$out\"\nNONCE=$(echo \"$out\" | sed -n 's/.*\"nonce\":\"\\([^\"]*\\)\".*/\\1/p')\n", line)
		default:
			script.WriteString(strings.ReplaceAll(line, "<nonce>", "\"$NONCE\"") + "\n")
		}
	}
	require.Equal(t, 2, sends, script.String())

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(beamtest.Binary(t))+":"+os.Getenv("PATH"),
		"BEAM_URL=http://127.0.0.1:"+port)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	out, err := cmd.Output()
	serveLog, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
	require.NoError(t, err, "script:\n%s\noutput:\n%s\nserve:\n%s", script.String(), out, serveLog)
	require.Contains(t, string(out), `"payload":{"message":"Echo: hello bob"}`)
	require.Contains(t, string(out), `"payload":{"message":"Echo: hi",`)
	// The trace of the last send, from the default data directory.
	require.Regexp(t, `(?m)^nonce \S+  alice@acme.beam.directory -> echo@beam.directory  intent conversation.message$`, string(out))
	require.Contains(t, string(out), "acked")
	_, err = os.Stat(filepath.Join(dir, ".beam-agents", "alice.json"))
	require.NoError(t, err)
}
