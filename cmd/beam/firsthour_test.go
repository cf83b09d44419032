package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runCLI runs the beam command line in process and returns its exit code,
// stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBadFlagIsReportedOnce(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, "send", "--bogus")
	require.Equal(t, 2, code)
	require.Equal(t, 1, strings.Count(stderr, "flag provided but not defined: -bogus"), stderr)
	require.NotContains(t, stderr, "beam send: flag provided")
	require.True(t, strings.HasPrefix(stderr, "flag provided but not defined: -bogus\nusage: beam send"), stderr)
}

func TestFlagsAfterPositionalArguments(t *testing.T) {
	t.Parallel()
	// The flag after TO INTENT is applied: the missing identity file is
	// the one named, not the default, and no usage is printed.
	code, _, stderr := runCLI(t, "send", "bob@acme.beam.directory", "conversation.message", "--identity", "/nonexistent/who.json")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "/nonexistent/who.json")
	require.NotContains(t, stderr, "usage:")

	// "--" ends the flags: what follows is positional.
	fs := newCmdFlags("beam x", "beam x", &bytes.Buffer{})
	v := fs.Bool("v", false, "")
	require.NoError(t, fs.parse([]string{"a", "-v", "--", "-b"}, 2, 2))
	require.True(t, *v)
	require.Equal(t, []string{"a", "-b"}, fs.Args())
}

func TestMissingRequiredFlagIsNamed(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, "keygen", "--out", t.TempDir()+"/x.json")
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(stderr, "beam keygen: --beam-id is required\nusage: beam keygen"), stderr)

	code, _, stderr = runCLI(t, "register", "--identity", "x.json")
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(stderr, "beam register: --name is required\n"), stderr)

	code, _, stderr = runCLI(t, "peer", "show-self", "--domain", "a.beam.directory", "--data-dir", t.TempDir())
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(stderr, "beam peer show-self: --nats-listen is required\n"), stderr)
}

func TestLeaseTakesSecondsOrDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"60": time.Minute, "1.5": 1500 * time.Millisecond, "90s": 90 * time.Second, "2m": 2 * time.Minute} {
		d, err := parseSecondsOrDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, d, in)
	}
	_, err := parseSecondsOrDuration("soon")
	require.EqualError(t, err, `"soon" is neither seconds (60) nor a duration (60s, 2m)`)
	_, err = parseSecondsOrDuration("-5")
	require.Error(t, err)

	var d time.Duration
	fs := newCmdFlags("beam poll", "beam poll", &bytes.Buffer{})
	fs.Var(leaseFlag{&d}, "lease", "")
	require.NoError(t, fs.parse([]string{"--lease", "60"}, 0, 0))
	require.Equal(t, time.Minute, d)
}

func TestEnvNamesAreOneMeaningEach(t *testing.T) {
	t.Parallel()
	require.Equal(t, "BEAM_POLL_STATUS", envName("beam poll", "status"))
	require.Equal(t, "BEAM_ACK_STATUS", envName("beam ack", "status"))
	require.Equal(t, "BEAM_REGISTER_NAME", envName("beam register", "name"))
	require.Equal(t, "BEAM_KEYGEN_OUT", envName("beam keygen", "out"))
	require.Equal(t, "BEAM_PEER_SHOW_SELF_DOMAIN", envName("beam peer show-self", "domain"))
	// Shared flags keep one name everywhere; serve keeps its documented names.
	require.Equal(t, "BEAM_URL", envName("beam poll", "url"))
	require.Equal(t, "BEAM_DATA_DIR", envName("beam trace", "data-dir"))
	require.Equal(t, "BEAM_ADMIN_TOKEN", envName("beam requeue", "admin-token"))
	require.Equal(t, "BEAM_DOMAIN", envName("beam serve", "domain"))
	require.Equal(t, "BEAM_TRACE_URL", envName("beam trace", "url"))

	// Every command's help names its own variables.
	_, _, stderr := runCLI(t, "poll", "--help")
	require.Contains(t, stderr, "(env BEAM_POLL_STATUS)")
	require.NotContains(t, stderr, "(env BEAM_STATUS)")
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, "help", "serve")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "-nats-listen")
	require.Contains(t, stderr, "(env BEAM_DATA_DIR)")

	code, stdout, _ := runCLI(t, "--version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(stdout, "beam "), stdout)
	require.Contains(t, stdout, "protocol beam/1")

	_, _, stderr = runCLI(t, "bench", "--help")
	require.NotContains(t, stderr, "-chaos beam serve")
	require.Contains(t, stderr, "-chaos\n")

	_, _, stderr = runCLI(t, "help")
	require.Contains(t, stderr, "trace      print the events of one intent or job, in order with time deltas")
	require.Contains(t, stderr, "beam peer show-self|add|list|remove|outbox|replay", "the dashboard sends users to beam peer outbox and replay")

	_, _, stderr = runCLI(t, "trace", "--help")
	require.Contains(t, stderr, "Prints the events of one intent")
	require.Contains(t, stderr, "-url string")
}

// TestMeshHelpAndOperatorFlags: beam mesh answers --help like every other
// command and takes the operator flags every operator command takes.
func TestMeshHelpAndOperatorFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help", "mesh"}, {"mesh", "--help"}, {"mesh", "-h"}} {
		code, _, stderr := runCLI(t, args...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		require.NotContains(t, stderr, "unknown subcommand", args)
		require.Contains(t, stderr, "usage: beam mesh create|get|list", args)
		require.Contains(t, stderr, "requeue", args)
	}
	code, _, stderr := runCLI(t, "mesh", "list", "--help")
	require.Equal(t, 0, code)
	for _, f := range []string{"-admin-token string", "(env BEAM_ADMIN_TOKEN)", "-data-dir string", "(env BEAM_DATA_DIR)", "-identity string", "-api-key string"} {
		require.Contains(t, stderr, f)
	}
	require.NotContains(t, stderr, "operator-token", "the old name is a hidden alias")

	// Nothing to authenticate with: say every way there is.
	empty := t.TempDir()
	code, _, stderr = runCLI(t, "mesh", "list", "--url", "http://127.0.0.1:1", "--data-dir", empty)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no operator token: pass --admin-token TOKEN, set BEAM_ADMIN_TOKEN, or point --data-dir at the directory's data directory")
	code, _, stderr = runCLI(t, "mesh", "list", "--url", "http://127.0.0.1:1", "--identity", filepath.Join(empty, "none.json"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "pass --identity FILE or --api-key KEY, or as the operator --admin-token or --data-dir")
}

// TestMissingIdentitySaysWhatToDo: an agent command without an identity
// file says how to name one or make one, not only that a file is missing.
func TestMissingIdentitySaysWhatToDo(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "beam-identity.json")
	for _, args := range [][]string{{"acl", "list"}, {"acl", "add", "*"}, {"send", "bob@acme.beam.directory", "conversation.message"}, {"approve", "bob@acme.beam.directory"}} {
		code, _, stderr := runCLI(t, append(args, "--url", "http://127.0.0.1:1", "--identity", missing)...)
		require.Equal(t, 1, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "no identity file "+missing+": pass --identity FILE (or set BEAM_IDENTITY), or create one with beam keygen --beam-id", args)
	}
}

// TestMeshCreateAsOperatorNeedsCreator: beam mesh create that falls back to
// the operator's token, without --creator, says which flag to pass instead
// of sending a request the gateway refuses; its help names one variable
// per flag.
func TestMeshCreateAsOperatorNeedsCreator(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "admin.token"), []byte("op-token\n"), 0o600))
	code, _, stderr := runCLI(t, "mesh", "create", "--route", "bob@acme.beam.directory", "--url", "http://127.0.0.1:1",
		"--data-dir", dir)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "beam mesh create acts as the operator here")
	require.Contains(t, stderr, "pass --identity FILE to create the envelope as that agent, or --creator ID")
	require.NotContains(t, stderr, "connection refused", "no request goes out")

	code, _, stderr = runCLI(t, "mesh", "create", "--route", "bob@acme.beam.directory", "--url", "http://127.0.0.1:1", "--admin-token", "t")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "--admin-token or BEAM_ADMIN_TOKEN is set")

	code, _, stderr = runCLI(t, "mesh", "create", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "the agent's API key (env BEAM_API_KEY)")
	require.NotContains(t, stderr, "BEAM_MESH_CREATE_API_KEY")
	require.NotContains(t, stderr, "default $BEAM_API_KEY")
}
