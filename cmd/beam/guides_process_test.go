package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// guideLine is one command of a guide's shell block.
type guideLine struct {
	section string
	command string
	// want is what the command's trailing comment says its output holds:
	// a comment that starts with `"` or `{` lists JSON members (or is a
	// JSON value) the output must contain, each as written (nil when the
	// comment is prose or there is none).
	want []string
}

// jsonMembers splits s at its top-level commas: `"a":1,"b":{"c":2,"d":3}`
// is `"a":1` and `"b":{"c":2,"d":3}`.
func jsonMembers(s string) []string {
	var (
		parts    []string
		depth    int
		inString bool
		start    int
	)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		case c == ',' && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

var (
	// guideComment is a comment after a command: two spaces or more, then #.
	guideComment = regexp.MustCompile(`\s{2,}# ?(.*)$`)
	// guideServe and guideListen start processes that run until the guide
	// ends, as in a terminal of their own.
	guideServe  = regexp.MustCompile(`^([A-Z_]+=\S+ )*beam serve( |$)`)
	guideListen = regexp.MustCompile(`^beam listen( |$)`)
)

// guideLines returns the commands of every shell block of the guide at
// path, in order.
func guideLines(t *testing.T, path string) []guideLine {
	t.Helper()
	var lines []guideLine
	for _, block := range shellBlocks(t, path) {
		for _, line := range block.lines {
			command, want := line, []string(nil)
			if m := guideComment.FindStringSubmatchIndex(line); m != nil {
				command = line[:m[0]]
				if c := line[m[2]:m[3]]; strings.HasPrefix(c, `"`) || strings.HasPrefix(c, "{") {
					want = jsonMembers(c)
				}
			}
			command = strings.TrimSpace(command)
			if command == "" || strings.HasPrefix(command, "#") {
				continue
			}
			require.False(t, strings.HasSuffix(command, `\`), "%s: %q continues on the next line; write one command per line", path, command)
			lines = append(lines, guideLine{section: block.section, command: command, want: want})
		}
	}
	return lines
}

// TestGuidesRunAsWritten runs every shell block of every guide in
// docs/guides with bash and the real binary, one command after another as
// a reader would, in a fresh directory per guide: `beam serve` and `beam
// listen` run in the background until the guide ends (as in terminals of
// their own), a guide that starts no `beam serve` itself gets one on the
// defaults (its guide says it expects one), the ports the guides name are
// replaced by free ones, curl fails on an HTTP error status, and each
// command must exit 0 and print what its trailing `# "…"` or `# {…}`
// comment shows. A fence in a language the test does not know fails it.
// Every `beam serve` gets BEAM_LISTEN and BEAM_INTENT_LISTEN on free ports,
// so a guide that runs two names its listeners on both. A cluster's lines
// (`beam cluster init`, `beam serve --cluster`) run by the README test's
// rules (clusterRules): the nodes start together, and the next command
// waits until every one serves.
func TestGuidesRunAsWritten(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	guides, err := filepath.Glob(filepath.Join("..", "..", "docs", "guides", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, guides)
	bin := beamtest.Binary(t)
	for _, path := range guides {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".md"), func(t *testing.T) {
			t.Parallel()
			runGuide(t, path, bin)
		})
	}
}

// runGuide runs the shell blocks of the guide at path (TestGuidesRunAsWritten).
func runGuide(t *testing.T, path, bin string) {
	lines := guideLines(t, path)
	ports := freePorts(t, "3100", "3101", "3102", "3200", "3201", "3202", "4222", "4223", "4224", "6222", "6223", "6224")
	var swaps []string
	for from, to := range ports {
		swaps = append(swaps, "127.0.0.1:"+from, "127.0.0.1:"+to, "localhost:"+from, "localhost:"+to)
	}
	portSwap := strings.NewReplacer(swaps...)

	var script strings.Builder
	script.WriteString("set -eo pipefail\nexec 2>&1\n")
	// An HTTP error status fails the command, as a non-zero exit does.
	script.WriteString("curl() { command curl --fail-with-body \"$@\"; }\n")
	script.WriteString(waitClusterShell)
	bg := &backgrounds{}
	// A cluster's lines run as in the README (clusterRules).
	rules := clusterRules(bg)
	wants := make([]string, len(lines))
	ownServer := false
	for _, l := range lines {
		ownServer = ownServer || guideServe.MatchString(l.command)
	}
	if !ownServer {
		script.WriteString(bg.run("beam serve", "beam serving on"))
	}
	for i, l := range lines {
		fmt.Fprintf(&script, "echo '@@@ %d'\n", i)
		command := portSwap.Replace(l.command)
		rule := matchRule(rules, command)
		if rule == nil || !rule.startsNode {
			script.WriteString("waitCluster\n")
		}
		switch {
		case rule != nil && rule.script != nil:
			wants[i] = rule.want
			script.WriteString(rule.script(command))
		case rule != nil:
			wants[i] = rule.want
			script.WriteString(command + "\n")
		case guideServe.MatchString(command):
			script.WriteString(bg.run(command, "beam serving on"))
		case guideListen.MatchString(command):
			script.WriteString(bg.run(command, "listening as"))
		default:
			script.WriteString(command + "\n")
		}
	}
	fmt.Fprintf(&script, "echo '@@@ %d'\nfor p in $(jobs -p); do kill $p 2>/dev/null || true; done\nwait\n", len(lines))

	dir := t.TempDir()
	run := runMarked(t, dir, script.String(), len(lines), 4*time.Minute, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"),
		"BEAM_URL=http://127.0.0.1:"+ports["3100"], "BEAM_LISTEN=127.0.0.1:"+ports["3100"], "BEAM_INTENT_LISTEN=127.0.0.1:"+ports["3200"])
	out, outputs, last := run.out, run.outputs, run.last
	if run.err != nil {
		failed := "(before the first command)"
		if last >= 0 && last < len(lines) {
			failed = fmt.Sprintf("%q (in %q)", lines[last].command, lines[last].section)
		}
		require.NoError(t, run.err, "%s: command %s failed\noutput:\n%s\nscript:\n%s\nbackground logs:\n%s", path, failed, outputs[max(last, 0)], script.String(), backgroundLogs(dir))
	}
	require.Equal(t, len(lines), last, "%s: the script ran to its end:\n%s", path, out)
	for i, l := range lines {
		if wants[i] != "" {
			require.Regexp(t, wants[i], outputs[i], "%s: the output of %q", path, l.command)
		}
		for _, w := range l.want {
			require.Contains(t, outputs[i], w, "%s: the output of %q", path, l.command)
		}
	}
}

// markedRun is what a script of marked commands did (runMarked).
type markedRun struct {
	out []byte
	// outputs holds each command's output, cut at the markers.
	outputs []string
	// last is the last marker the script reached (-1: none).
	last int
	err  error
}

// runMarked runs script with bash in dir, with env added to the test's
// environment, in a process group of its own that is killed when the test
// ends (with every background process the script started), and cuts its
// output at the markers "@@@ N" (0 <= N <= commands) it echoes before each
// command and at its end.
func runMarked(t *testing.T, dir, script string, commands int, timeout time.Duration, env ...string) markedRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	out, err := cmd.Output()
	run := markedRun{out: out, outputs: make([]string, commands+1), last: -1, err: err}
	for _, l := range strings.SplitAfter(string(out), "\n") {
		if rest, ok := strings.CutPrefix(l, "@@@ "); ok {
			run.last, _ = strconv.Atoi(strings.TrimSpace(rest))
			continue
		}
		if run.last >= 0 && run.last <= commands {
			run.outputs[run.last] += l
		}
	}
	return run
}

// backgroundLogs returns the background*.log files of dir, each after a
// line with its name.
func backgroundLogs(dir string) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(dir, "background*.log"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "--- %s\n%s", filepath.Base(f), data)
	}
	return b.String()
}
