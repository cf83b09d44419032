package federation

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestBeforeSubscribeRunsBeforeTheQueueGroup: cluster mode refuses a node
// in Config.BeforeSubscribe (its directory key differs from the cluster's).
// The hook runs before the node subscribes its subjects in the queue group,
// so a refused node never takes a federation message; a node the hook lets
// through subscribes.
func TestBeforeSubscribeRunsBeforeTheQueueGroup(t *testing.T) {
	t.Parallel()
	// An external NATS server that admits both nodes' keys and a probe.
	paths := [2]string{t.TempDir(), t.TempDir()}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true,
		Users: []*server.User{{Username: "probe", Password: "probe"}}}
	for _, p := range paths {
		priv, _, err := LoadOrCreateKey(p)
		require.NoError(t, err)
		user, err := NkeyUser(priv.Public().(ed25519.PublicKey))
		require.NoError(t, err)
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: user})
	}
	ns, err := server.NewServer(opts)
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(ns.Shutdown)
	require.True(t, ns.ReadyForConnections(10*time.Second))
	probe, err := nats.Connect(ns.ClientURL(), nats.UserInfo("probe", "probe"))
	require.NoError(t, err)
	t.Cleanup(probe.Close)
	const domain = "alpha.beam.directory"
	subject := Subject(domain, "beta.beam.directory", kindIntent)
	// subscribed reports whether anyone takes the subject: an unreadable
	// message gets no answer from a subscribed node (a timeout), and
	// ErrNoResponders when nobody subscribes.
	subscribed := func() bool {
		_, err := probe.Request(subject, []byte("probe"), 300*time.Millisecond)
		require.Error(t, err)
		return !errors.Is(err, nats.ErrNoResponders)
	}
	refused := errors.New("directory key differs from the cluster's")
	external := func(hook func(*nats.Conn) error) func(*Config) {
		return func(c *Config) {
			c.NATSListen, c.NATSURL, c.QueueGroup, c.BeforeSubscribe = "", ns.ClientURL(), "beam-fed-alpha", hook
		}
	}

	var ran bool
	d, cfg := prepareDir(t, domain, paths[0], "", external(func(*nats.Conn) error {
		ran = true
		require.False(t, subscribed(), "the hook runs before the subscription")
		return refused
	}))
	t.Cleanup(d.stop)
	_, err = New(context.Background(), cfg)
	require.ErrorIs(t, err, refused)
	require.True(t, ran)
	require.False(t, subscribed(), "a refused node does not subscribe")

	ok := startDir(t, domain, paths[1], "", external(func(*nats.Conn) error { return nil }))
	require.NotNil(t, ok.node)
	require.True(t, subscribed(), "a node the hook lets through subscribes")
}
