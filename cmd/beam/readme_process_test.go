package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// readmeBlock is one fenced shell block of README.md with the heading of
// the section it is in.
type readmeBlock struct {
	section string
	lines   []string
}

// readmeShellBlocks returns every fenced shell block (```sh, ```bash,
// ```shell) of README.md in order. A fence in a language the test does not
// know fails the test, so a new kind of block cannot slip past it.
func readmeShellBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	return shellBlocks(t, filepath.Join("..", "..", "README.md"))
}

// shellBlocks returns every fenced shell block of the Markdown file at path
// in order, failing the test on a fence in a language it does not know.
func shellBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var (
		blocks  []readmeBlock
		section string
		cur     *readmeBlock
		inFence bool
	)
	for n, line := range strings.Split(string(b), "\n") {
		fence, isFence := strings.CutPrefix(line, "```")
		switch {
		case isFence && inFence:
			inFence = false
			if cur != nil {
				blocks = append(blocks, *cur)
				cur = nil
			}
		case isFence:
			inFence = true
			switch strings.TrimSpace(fence) {
			case "sh", "bash", "shell":
				cur = &readmeBlock{section: section}
			case "go", "":
				// Go source and configuration text, not commands.
			default:
				t.Fatalf("%s line %d: a ```%s block; the process tests know sh, bash, go and plain blocks", path, n+1, fence)
			}
		case inFence && cur != nil:
			cur.lines = append(cur.lines, line)
		case strings.HasPrefix(line, "#"):
			section = line
		}
	}
	require.False(t, inFence, "%s ends inside a fenced block", path)
	return blocks
}

// freePorts maps each of names to a distinct free port (freePort).
func freePorts(t *testing.T, names ...string) map[string]string {
	t.Helper()
	ports := make(map[string]string, len(names))
	for _, name := range names {
		ports[name] = fmt.Sprint(freePort(t))
	}
	return ports
}

// readmeRule says how the README test runs the README lines it matches
// and what their output must show.
type readmeRule struct {
	match *regexp.Regexp
	// script turns the line (ports already replaced) into bash; nil runs it
	// as written.
	script func(line string) string
	// want must match the output of the line ("" checks the exit status
	// only).
	want string
	// startsNode: the line starts a cluster node in the background without
	// waiting for it (a node serves once the cluster formed); the next
	// line of another rule waits until every such node serves.
	startsNode bool
}

// waitFor is bash that waits until file contains text, then fails the
// script (set -e) if it never did.
func waitFor(file, text string) string {
	return fmt.Sprintf("for i in $(seq 600); do grep -q %q %s && break; sleep 0.1; done\ngrep -q %q %s\n", text, file, text, file)
}

// backgrounds names the logs of the processes a process test's script
// starts in the background: background1.log, background2.log, …
type backgrounds struct{ n int }

// log returns the next log's name.
func (b *backgrounds) log() string {
	b.n++
	return fmt.Sprintf("background%d.log", b.n)
}

// run is bash that runs line in the background until it prints ready.
func (b *backgrounds) run(line, ready string) string {
	log := b.log()
	return fmt.Sprintf("%s > %s 2>&1 &\n%s", line, log, waitFor(log, ready))
}

// waitClusterShell defines the bash function waitCluster, which waits until
// every cluster node started since its last call ($CLUSTER_NODES, LOG:PID
// each) serves (a node serves once the cluster formed; the join takes up to
// two minutes), and fails the script (set -e) as soon as one exits before
// it serves, or if one never does.
const waitClusterShell = `waitCluster() {
  local n ready i
  for i in $(seq 1800); do
    ready=1
    for n in $CLUSTER_NODES; do
      grep -q 'beam serving on' ${n%:*} && continue
      kill -0 ${n##*:} 2>/dev/null || { echo "the cluster node logging to ${n%:*} exited"; CLUSTER_NODES=; return 1; }
      ready=0
    done
    [ $ready = 1 ] && break
    sleep 0.1
  done
  for n in $CLUSTER_NODES; do grep -q 'beam serving on' ${n%:*}; done
  CLUSTER_NODES=
}
`

// clusterRules are the rules for the lines of a cluster recipe, which the
// README and the guides share: beam cluster init, and the beam serve
// --cluster lines, which start their nodes in the background together (a
// script calls waitCluster before its next line of another kind).
func clusterRules(bg *backgrounds) []readmeRule {
	return []readmeRule{
		{match: regexp.MustCompile(`^beam cluster init --nodes 3 --domain acme\.beam\.directory --out acme$`), want: `(?m)^wrote acme/node3$`},
		{match: regexp.MustCompile(`^beam serve --cluster `), startsNode: true, script: func(line string) string {
			log := bg.log()
			return fmt.Sprintf("%s > %s 2>&1 &\nCLUSTER_NODES=\"$CLUSTER_NODES %s:$!\"\n", line, log, log)
		}},
	}
}

// matchRule returns the first of rules that matches line, nil if none does.
func matchRule(rules []readmeRule, line string) *readmeRule {
	for i := range rules {
		if rules[i].match.MatchString(line) {
			return &rules[i]
		}
	}
	return nil
}

// readmeRules are the commands the README may use, first match wins. A
// README line that none matches fails the test.
func readmeRules() []readmeRule {
	bg := &backgrounds{}
	serve := func(line string) string { return bg.run(line, "beam serving on") }
	built := func(line string) string {
		// The test built the binary already: bin/beam is a link to it.
		return "mkdir -p bin && ln -sf \"$BEAM_BIN\" bin/beam" + strings.TrimPrefix(line, "go build -o bin/beam ./cmd/beam") + "\n"
	}
	send := func(line string) string {
		return fmt.Sprintf("out=$(%s)\necho \"$out\"\nNONCE=$(echo \"$out\" | sed -n 's/.*\"nonce\":\"\\([^\"]*\\)\".*/\\1/p' | tail -n 1)\n", line)
	}
	return append(clusterRules(bg), []readmeRule{
		// make run is beam serve on the defaults; the test runs the binary
		// it built, with BEAM_LISTEN and BEAM_INTENT_LISTEN on free ports.
		{match: regexp.MustCompile(`^make run$`), want: `(?m)\bgo run \./cmd/beam serve\s*\n(.|\n)*\{"status":"ok","protocol":"beam/1"`,
			script: func(string) string {
				return "make -s -C \"$REPO\" -n run\n" + serve("beam serve") + "curl -s \"$BEAM_URL/health\"\necho\n"
			}},
		// make test cannot run the tests from inside them: its recipe is
		// checked instead.
		{match: regexp.MustCompile(`^make test$`), want: `\bgo test -race -count=1 `,
			script: func(string) string { return "make -s -C \"$REPO\" -n test\n" }},
		{match: regexp.MustCompile(`^go build -o bin/beam \./cmd/beam && export PATH=\$PWD/bin:\$PATH$`), script: built},
		// beam bench on a small count.
		{match: regexp.MustCompile(`^go build -o bin/beam \./cmd/beam && bin/beam bench --mode ws --count \d+ --concurrency \d+$`),
			want: `(?m)^ws +200 +8 +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +0 `,
			script: func(line string) string {
				line = regexp.MustCompile(`--count \d+ --concurrency \d+`).ReplaceAllString(line, "--count 200 --concurrency 8")
				// A reader's shell has no BEAM_URL: bench starts its own directory.
				return "(unset BEAM_URL; " + strings.TrimSuffix(built(line), "\n") + ")\n"
			}},
		{match: regexp.MustCompile(`^curl -s http://127\.0\.0\.1:\d+/agents/carol@acme\.beam\.directory$`), want: `"beamId":"carol@acme\.beam\.directory"`},
		{match: regexp.MustCompile(`^([A-Z_]+=\S+ )*beam serve( |$)`), script: serve},
		{match: regexp.MustCompile(`^beam listen .*--echo$`), script: func(line string) string { return bg.run(line, "listening as") }},
		{match: regexp.MustCompile(`^[AB]=\$\(beam peer show-self --data-dir \S+ +--domain \S+ +--nats-listen \S+\)$`),
			want:   `^[ab][a-z]+\.beam\.directory=nats://127\.0\.0\.1:\d+#[A-Za-z0-9_-]{43}\n$`,
			script: func(line string) string { return line + "\necho \"$" + line[:1] + "\"\n" }},
		{match: regexp.MustCompile(`^beam keygen --beam-id \S+ --out \.beam-agents/\w+\.json$`), want: `(?m)^written to: \.beam-agents/\w+\.json$`},
		{match: regexp.MustCompile(`^beam register (--url \S+ )?--identity \S+ --name \w+$`), want: `(?m)^api key stored in \.beam-agents/\w+\.json$`},
		{match: regexp.MustCompile(`^beam approve --identity \S+ \S+$`), want: `^\{"beamId":"alice@acme\.beam\.directory","status":"member"\}\n$`},
		{match: regexp.MustCompile(`^beam acl add (--url \S+ )?--identity \S+ \S+$`), want: `"allowed_from":"a@alpha.beam.directory"`},
		{match: regexp.MustCompile(`^beam send .* bob@acme\.beam\.directory conversation\.message '\{"message":"hello bob"\}'$`),
			want: `"success":true,.*"payload":\{"message":"Echo: hello bob"\}`, script: send},
		{match: regexp.MustCompile(`^beam send .* echo@beam\.directory conversation\.message '\{"message":"hi"\}'$`),
			want: `"success":true,.*"payload":\{"message":"Echo: hi",`, script: send},
		{match: regexp.MustCompile(`^beam send .* b@beta\.beam\.directory conversation\.message '\{"message":"hi b"\}'$`),
			want: `"success":true,.*"payload":\{"message":"Echo: hi b"\}`, script: send},
		// The trace of the last send, from the default data directory.
		{match: regexp.MustCompile(`^beam trace --data-dir \./beam-data <nonce>$`),
			want:   `(?m)^nonce \S+  alice@acme\.beam\.directory -> echo@beam\.directory  intent conversation\.message$(.|\n)*acked`,
			script: func(line string) string { return strings.ReplaceAll(line, "<nonce>", "\"$NONCE\"") + "\n" }},
		// The pipeline through bob's beam listen --echo: the id mesh create
		// printed, then the envelope once it has succeeded, with a flat
		// payload, and its trace.
		{match: regexp.MustCompile(`^beam mesh create --identity \S+ --route \S+ --payload '\{"text":"hi"\}'$`),
			want: `^\{"id":"[0-9a-f-]+","status":"pending"\}\n$`,
			script: func(line string) string {
				return fmt.Sprintf("out=$(%s)\necho \"$out\"\nENVELOPE=$(echo \"$out\" | sed -n 's/.*\"id\":\"\\([^\"]*\\)\".*/\\1/p')\n", line)
			}},
		{match: regexp.MustCompile(`^beam mesh get --identity \S+ <id>$`),
			want: `"status":"succeeded".*"payload":\{"echoedBy":\["bob@acme\.beam\.directory","bob@acme\.beam\.directory","bob@acme\.beam\.directory"\],"text":"hi"\}`,
			script: func(line string) string {
				line = strings.ReplaceAll(line, "<id>", "\"$ENVELOPE\"")
				return fmt.Sprintf("for i in $(seq 300); do out=$(%s); echo \"$out\" | grep -q '\"status\":\"succeeded\"' && break; sleep 0.1; done\necho \"$out\"\n", line)
			}},
		{match: regexp.MustCompile(`^beam trace --data-dir \./beam-data <id>$`),
			want:   `(?m)^nonce mesh:\S+  alice@acme\.beam\.directory -> (.|\n)*succeeded`,
			script: func(line string) string { return strings.ReplaceAll(line, "<id>", "\"$ENVELOPE\"") + "\n" }},
		{match: regexp.MustCompile(`^echo '\{"pipelines":.*\}' > pipelines\.json$`)},
		{match: regexp.MustCompile(`^curl -s localhost:\d+/\.well-known/agent-card\.json$`),
			want: `"skills":\[\{"id":"greet","name":"greet","description":"Says hello \(agent card: http://localhost:\d+/a2a/pipelines/greet/\.well-known/agent-card\.json\)"`},
		{match: regexp.MustCompile(`^curl -s -XPOST localhost:\d+/intent -H 'X-API-KEY: change-me' -d '\{"goal":"send","payload":\{"to":"x"\}\}'$`),
			want: `^\{"id":"[^"]+"`},
		{match: regexp.MustCompile(`^curl -s -XPOST 'localhost:\d+/claim\?namespace=default' -H 'X-API-KEY: change-me'$`),
			want: `"goal":"send"(.|\n)*"payload":\{"to":"x"\}`},
	}...)
}

// TestReadmeRunsAsWritten runs every shell block of README.md in order with
// bash and the real binary, one line after another as a reader would: the
// directories, listeners and demo of a section run in the background until
// the next section starts, the ports the README names are replaced by free
// ones, and each line's exit status and output are checked. A README line
// the test has no rule for fails it.
func TestReadmeRunsAsWritten(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	ports := freePorts(t, "3100", "3101", "3102", "3200", "3201", "3202", "4222", "4223", "6222", "6223", "6224")
	// One pass over each line: replacing port by port could rewrite a port
	// put there by an earlier replacement (3101 → 31003, then 3100 → …).
	var swaps []string
	for from, to := range ports {
		swaps = append(swaps, "127.0.0.1:"+from, "127.0.0.1:"+to, "localhost:"+from, "localhost:"+to)
	}
	portSwap := strings.NewReplacer(swaps...)
	rules := readmeRules()
	var (
		script  strings.Builder
		lines   []string // README line of each marker
		wants   []string
		section string
	)
	// Output is cut per line at the markers; a section's background
	// processes stop (SIGTERM, as Ctrl-C) before the next section starts.
	script.WriteString("set -e\nexec 2>&1\nstop() { for p in $(jobs -p); do kill $p 2>/dev/null || true; done; wait; }\n")
	script.WriteString(waitClusterShell)
	for _, block := range readmeShellBlocks(t) {
		if block.section != section {
			script.WriteString("stop\n")
			section = block.section
		}
		for _, line := range block.lines {
			if c := strings.Index(line, "   # "); c >= 0 {
				line = line[:c]
			}
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			line = portSwap.Replace(line)
			rule := matchRule(rules, line)
			require.NotNil(t, rule, "README line %q (in %q) has no rule in TestReadmeRunsAsWritten: add one that runs it and checks its outcome", line, section)
			fmt.Fprintf(&script, "echo '@@@ %d'\n", len(lines))
			if !rule.startsNode {
				script.WriteString("waitCluster\n")
			}
			lines, wants = append(lines, line), append(wants, rule.want)
			if rule.script == nil {
				script.WriteString(line + "\n")
			} else {
				script.WriteString(rule.script(line))
			}
		}
	}
	fmt.Fprintf(&script, "echo '@@@ %d'\nstop\n", len(lines))

	dir := t.TempDir()
	bin := beamtest.Binary(t)
	run := runMarked(t, dir, script.String(), len(lines), 7*time.Minute, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "BEAM_BIN="+bin, "REPO="+repo,
		"BEAM_URL=http://127.0.0.1:"+ports["3100"], "BEAM_LISTEN=127.0.0.1:"+ports["3100"], "BEAM_INTENT_LISTEN=127.0.0.1:"+ports["3200"])
	out, outputs, last := run.out, run.outputs, run.last
	if run.err != nil {
		failed := "(before the first line)"
		if last >= 0 && last < len(lines) {
			failed = lines[last]
		}
		require.NoError(t, run.err, "README line failed: %s\noutput:\n%s\nscript:\n%s\nall output:\n%s\n%s", failed, outputs[max(last, 0)], script.String(), out, backgroundLogs(dir))
	}
	require.Equal(t, len(lines), last, "the script ran to its end:\n%s", out)
	for i, line := range lines {
		if wants[i] != "" {
			require.Regexp(t, wants[i], outputs[i], "output of README line %s", line)
		}
	}
	// The walk-through's identity files hold private keys: git ignores them.
	_, err = os.Stat(filepath.Join(dir, ".beam-agents", "alice.json"))
	require.NoError(t, err)
	ignore, err := os.ReadFile(filepath.Join(repo, ".gitignore"))
	require.NoError(t, err)
	require.Contains(t, strings.Split(string(ignore), "\n"), "/.beam-agents/")
}
