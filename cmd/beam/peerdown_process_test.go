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
	fp := startFedPair(t, true, []string{"--default-policy", "allow", "--http-timeout", "3s"}, []string{"--default-policy", "allow"})
	alpha, beta, alphaDir, betaNATS := fp.alpha, fp.beta, fp.alpha.DataDir, fp.betaNATS
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
		"plain sends to its agents fail at once (DELIVERY_FAILED) once a lost link has been down 2 s, durable ones wait in the outbox until it is back.\n")

	// Once the link has been down a while (a send before that waits for
	// its timeout, 3 s here), a plain send fails at once.
	var out string
	require.Eventually(t, func() bool {
		out = r.fail("send", "--identity", a, "b@beta.beam.directory", "conversation.message", `{"message":"hi b"}`)
		return strings.Contains(out, "DELIVERY_FAILED")
	}, 30*time.Second, 50*time.Millisecond, "a plain send to the peer that is down fails at once")
	require.Contains(t, out, "DELIVERY_FAILED (HTTP 502): Not sent to b@beta.beam.directory: "+
		"its directory beta.beam.directory is unreachable from this one (no connection to it). "+
		"Check that it is running (beam peer list on this directory shows the link), then send again, "+
		"or send with --durable to have it delivered when beta.beam.directory is back\n", out)
	require.NotContains(t, out, "context deadline exceeded")
	require.Regexp(t, `\nnonce \S+: beam trace \S+ shows its events`, out)

	// A durable send is stored and says where its outcome will be.
	rec, out := r.sendDurable("--identity", a, "b@beta.beam.directory", "conversation.message", `{"message":"later"}`)
	require.Contains(t, out, "; the outcome comes later: beam trace "+rec.Nonce+" (--data-dir of the directory, or --url) shows it, beam dead-letters lists it if every retry fails")
}

// fedPair is two federated beam serve processes, alpha.beam.directory and
// beta.beam.directory, on embedded NATS servers.
type fedPair struct {
	alpha, beta         *beamtest.Process
	alphaLine, betaLine string // their peer lines
	alphaNATS, betaNATS string // their NATS addresses
}

// startFedPair starts alpha pinning beta and beta, pinning alpha when
// betaPinsAlpha (otherwise beam peer add pins it later), each with its
// extra flags.
func startFedPair(t *testing.T, betaPinsAlpha bool, alphaArgs, betaArgs []string) fedPair {
	t.Helper()
	alphaDir, betaDir := t.TempDir(), t.TempDir()
	fp := fedPair{alphaNATS: freeAddr(t), betaNATS: freeAddr(t)}
	fp.alphaLine = showSelf(t, alphaDir, "alpha.beam.directory", fp.alphaNATS)
	fp.betaLine = showSelf(t, betaDir, "beta.beam.directory", fp.betaNATS)
	fp.alpha = beamtest.Start(t, beamtest.Options{DataDir: alphaDir, Args: append([]string{"--domain", "alpha.beam.directory",
		"--nats-listen", fp.alphaNATS, "--peer", fp.betaLine}, alphaArgs...)})
	args := []string{"--domain", "beta.beam.directory", "--nats-listen", fp.betaNATS}
	if betaPinsAlpha {
		args = append(args, "--peer", fp.alphaLine)
	}
	fp.beta = beamtest.Start(t, beamtest.Options{DataDir: betaDir, Args: append(args, betaArgs...)})
	return fp
}
