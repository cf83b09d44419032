package federation

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// sharedNATS starts a NATS server standing for an operator's deployment:
// one nkey user per directory key, each with SharedPermissions.
func sharedNATS(t *testing.T, dirs map[string][]byte) string {
	t.Helper()
	var users []*server.NkeyUser
	for domain, priv := range dirs {
		kp, err := nkeyPair(priv)
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: SharedPermissions(domain)})
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true, Nkeys: users})
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	return ns.ClientURL()
}

// Two directories federate through one existing NATS deployment
// (--nats-url) instead of their embedded servers.
func TestDirectoriesThroughSharedNATS(t *testing.T) {
	t.Parallel()
	keys := map[string][]byte{}
	paths := map[string]string{}
	for _, d := range []string{"alpha.beam.directory", "beta.beam.directory"} {
		paths[d] = t.TempDir()
		priv, _, err := LoadOrCreateKey(paths[d])
		require.NoError(t, err)
		keys[d] = priv
	}
	url := sharedNATS(t, keys)
	external := func(c *Config) { c.NATSListen, c.NATSURL = "", url }
	alpha := startDir(t, "alpha.beam.directory", paths["alpha.beam.directory"], "", external)
	beta := startDir(t, "beta.beam.directory", paths["beta.beam.directory"], "", external)
	pin(t, alpha, beta)

	b := beta.agent("b")
	var handled atomic.Int64
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		handled.Add(1)
		return agents.Success(map[string]any{"from": in.From})
	})
	require.NoError(t, b.Connect(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	aWS := alpha.agent("a")
	require.NoError(t, aWS.Connect(ctx))
	res, err := aWS.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 1})
	require.NoError(t, err)
	require.True(t, res.Success)
	aHTTP := alpha.agent("a2")
	res2, err := aHTTP.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 2})
	require.NoError(t, err)
	require.True(t, res2.Success)
	require.EqualValues(t, 2, handled.Load())
	for _, nonce := range []string{res.Nonce, res2.Nonce} {
		full := []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}
		// The origin's dispatched annotations are the outbox's steps.
		require.Equal(t, full, lifecycle(alpha.trace(nonce)))
		requireOutboxSteps(t, alpha.trace(nonce), Published)
		require.Equal(t, full, states(beta.trace(nonce)))
	}

	// The deployment's permissions hold: alpha's user cannot speak as
	// another origin, nor read beta's requests or replies.
	kp, err := nkeyPair(keys["alpha.beam.directory"])
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	violations := make(chan error, 4)
	nc, err := nats.Connect(url, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(InboxPrefix("alpha.beam.directory")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.Publish(Subject("beta.beam.directory", "gamma.beam.directory", kindIntent), []byte("x")))
	require.NoError(t, nc.Flush())
	requirePermissionViolation(t, violations)
	_, err = nc.SubscribeSync(subjectPrefix + ".beta_beam_directory.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	requirePermissionViolation(t, violations)
	_, err = nc.SubscribeSync(InboxPrefix("beta.beam.directory") + ".>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	requirePermissionViolation(t, violations)
}

func requirePermissionViolation(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		require.True(t, errors.Is(err, nats.ErrPermissionViolation), "got %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not report a permission violation")
	}
}
