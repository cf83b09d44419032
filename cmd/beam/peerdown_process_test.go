package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// A peer directory that is down is named, with what to do, by beam peer
// list and by a send to one of its agents.
func TestPeerDownIsNamedWithWhatToDo(t *testing.T) {
	t.Parallel()
	alphaDir, betaDir := t.TempDir(), t.TempDir()
	alphaNATS, betaNATS := freeAddr(t), freeAddr(t)
	alphaLine := showSelf(t, alphaDir, "alpha.beam.directory", alphaNATS)
	betaLine := showSelf(t, betaDir, "beta.beam.directory", betaNATS)
	alpha := beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: []string{"--domain", "alpha.beam.directory",
		"--nats-listen", alphaNATS, "--peer", betaLine, "--default-policy", "allow", "--http-timeout", "3s"}})
	beta := beamtest.Start(t, beamtest.Options{DataDir: betaDir, Args: []string{"--domain", "beta.beam.directory",
		"--nats-listen", betaNATS, "--peer", alphaLine, "--default-policy", "allow"}})
	r := newCLIRunner(t, alpha)
	a := r.agent("a", "a@alpha.beam.directory")
	r.ok("keygen", "--beam-id", "b@beta.beam.directory", "--out", "b.json")
	r.ok("register", "--url", beta.URL(), "--identity", "b.json", "--name", "b")

	betaURL := "nats://" + betaNATS
	list := func() string { return r.ok("peer", "list", "--data-dir", alphaDir) }
	require.Eventually(t, func() bool {
		return strings.Contains(list(), "beta.beam.directory  "+betaURL+"  up ")
	}, 30*time.Second, 50*time.Millisecond, "the link to beta comes up")

	beta.Stop()
	require.Eventually(t, func() bool {
		return strings.Contains(list(), "beta.beam.directory  "+betaURL+"  down ")
	}, 30*time.Second, 50*time.Millisecond, "the link to beta is seen down")
	require.Contains(t, list(), "beta.beam.directory is unreachable: no connection to "+betaURL+
		". Check that its directory is running and that this host reaches that address; "+
		"sends to its agents wait in the outbox meanwhile (plain sends until their timeout, durable ones until it is back).\n")

	out := r.fail("send", "--identity", a, "b@beta.beam.directory", "conversation.message", `{"message":"hi b"}`)
	require.Contains(t, out, "TIMEOUT (HTTP 504): No result from b@beta.beam.directory within 3s: "+
		"its directory beta.beam.directory is unreachable from this one (no connection to it). "+
		"Check that it is running (beam peer list on this directory shows the link), then send again, "+
		"or send with --durable to have it delivered when beta.beam.directory is back\n", out)
	require.NotContains(t, out, "context deadline exceeded")
	require.Regexp(t, `\nnonce \S+: beam trace \S+ shows its events`, out)
}
