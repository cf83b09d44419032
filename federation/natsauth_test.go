package federation

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
)

// dialAs connects to d's NATS server with key priv, reporting
// asynchronous errors and disconnections on the returned channels.
func dialAs(d *fedDir, priv ed25519.PrivateKey, domain string, extra ...nats.Option) (*nats.Conn, chan error, chan struct{}, error) {
	kp, err := nkeyPair(priv)
	if err != nil {
		return nil, nil, nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, nil, nil, err
	}
	errs, gone := make(chan error, 16), make(chan struct{}, 16)
	opts := append([]nats.Option{
		nats.Secure(PeerTLS(ed25519.PrivateKey(d.key).Public().(ed25519.PublicKey))),
		nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(InboxPrefix(domain)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			select {
			case gone <- struct{}{}:
			default:
			}
		}),
	}, extra...)
	nc, err := nats.Connect("nats://"+d.natsAddr, opts...)
	return nc, errs, gone, err
}

// waitSignal waits for one value on ch.
func waitSignal[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s", what)
	}
	var zero T
	return zero
}

func TestRemovedPeerConnectionClosedAndRefused(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)

	// alpha's live connection to beta, reconnecting as a directory does.
	nc, errs, gone, err := dialAs(beta, alpha.key, "alpha.beam.directory",
		nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.IgnoreAuthErrorAbort())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	_, err = nc.SubscribeSync(InboxPrefix("alpha.beam.directory") + ".x")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	require.True(t, nc.IsConnected())

	ok, err := beta.node.RemovePeer(context.Background(), "alpha.beam.directory")
	require.NoError(t, err)
	require.True(t, ok)
	waitSignal(t, gone, "disconnection of the removed peer")
	require.ErrorIs(t, waitSignal(t, errs, "refusal of the reconnect"), nats.ErrAuthorization)
	require.False(t, nc.IsConnected())

	// A fresh connection is refused too; beta's own link to alpha's
	// server is not affected by beta's table.
	_, _, _, err = dialAs(beta, alpha.key, "alpha.beam.directory")
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// Pinned again, alpha gets in again (the reconnecting connection too).
	require.NoError(t, beta.node.AddPeer(context.Background(), alpha.node.Self()))
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)
}

func TestRotatedPeerKeyCutsOldConnections(t *testing.T) {
	t.Parallel()
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	const gamma = "gamma.beam.directory"
	oldPub, oldKey, err := wire.GenerateKey()
	require.NoError(t, err)
	require.NoError(t, beta.node.AddPeer(context.Background(), Peer{Domain: gamma, URL: "nats://127.0.0.1:1", PublicKey: oldPub}))
	nc, _, gone, err := dialAs(beta, oldKey, gamma, nats.NoReconnect())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.Flush())

	newPub, newKey, err := wire.GenerateKey()
	require.NoError(t, err)
	require.NoError(t, beta.node.AddPeer(context.Background(), Peer{Domain: gamma, URL: "nats://127.0.0.1:1", PublicKey: newPub}))
	waitSignal(t, gone, "disconnection of the replaced key")
	_, _, _, err = dialAs(beta, oldKey, gamma)
	require.ErrorIs(t, err, nats.ErrAuthorization)
	nc2, errs, _, err := dialAs(beta, newKey, gamma)
	require.NoError(t, err)
	t.Cleanup(nc2.Close)
	// The new key has gamma's permissions.
	require.NoError(t, nc2.Publish(Subject("beta.beam.directory", "alpha.beam.directory", kindIntent), []byte("x")))
	require.NoError(t, nc2.Flush())
	require.ErrorIs(t, waitSignal(t, errs, "permission violation"), nats.ErrPermissionViolation)
}

// Peers are pinned while other peers connect and disconnect: no options
// reload races a client's CONNECT (run with -race), every pinned peer gets
// in with its own permissions and no connection is refused.
func TestPeersAddedWhileOthersConnect(t *testing.T) {
	t.Parallel()
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	ctx := context.Background()
	type fake struct {
		domain string
		key    ed25519.PrivateKey
	}
	newFake := func(i int) fake {
		pub, priv, err := wire.GenerateKey()
		require.NoError(t, err)
		f := fake{domain: fmt.Sprintf("p%d.beam.directory", i), key: priv}
		require.NoError(t, beta.node.AddPeer(ctx, Peer{Domain: f.domain, URL: "nats://127.0.0.1:1", PublicKey: pub}))
		return f
	}
	const connectors, added = 4, 24
	stable := make([]fake, connectors)
	for i := range stable {
		stable[i] = newFake(i)
	}

	stop := make(chan struct{})
	failures := make(chan error, connectors)
	var wg sync.WaitGroup
	connects := make([]int, connectors)
	for i, f := range stable {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, _, _, err := dialAs(beta, f.key, f.domain, nats.NoReconnect())
				if err == nil {
					err = nc.Flush()
					nc.Close()
				}
				if err != nil {
					failures <- fmt.Errorf("%s: %w", f.domain, err)
					return
				}
				connects[i]++
			}
		}()
	}
	for i := range added {
		f := newFake(connectors + i)
		nc, errs, _, err := dialAs(beta, f.key, f.domain, nats.NoReconnect())
		require.NoError(t, err)
		// Its own subject is allowed, another peer's is not.
		require.NoError(t, nc.Publish(Subject("beta.beam.directory", f.domain, kindIntent), []byte("x")))
		require.NoError(t, nc.Publish(Subject("beta.beam.directory", stable[0].domain, kindIntent), []byte("x")))
		require.NoError(t, nc.Flush())
		err = waitSignal(t, errs, "permission violation")
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
		require.Contains(t, err.Error(), Token(stable[0].domain), "only the foreign subject is refused")
		nc.Close()
	}
	close(stop)
	wg.Wait()
	close(failures)
	for err := range failures {
		require.NoError(t, err)
	}
	for i, n := range connects {
		require.Positive(t, n, "connector %d never connected", i)
	}
}

// TestRepinnedPeerLinkCountsAsContact: a peer removed and pinned again has
// a last contact as soon as the link is up (its TLS certificate verified
// against the pinned key), not "never" until the next message.
func TestRepinnedPeerLinkCountsAsContact(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	ctx := context.Background()
	_, err := alpha.node.RemovePeer(ctx, "beta.beam.directory")
	require.NoError(t, err)
	require.NoError(t, alpha.node.AddPeer(ctx, beta.node.Self()))
	require.Eventually(t, func() bool {
		for _, p := range alpha.node.Peers() {
			if p.Domain == "beta.beam.directory" {
				return !p.LastContact.IsZero()
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the link's connection is recorded as contact")
	require.False(t, alpha.node.LinkDown("beta.beam.directory"))
}

// TestPlainSendToPeerKnownDownFailsAtOnce: a plain send to an agent of a
// peer whose link has been down for a while fails at once, retryable
// DELIVERY_FAILED naming the peer, and leaves nothing in the outbox to go out
// later; it does not wait for its timeout.
func TestPlainSendToPeerKnownDownFailsAtOnce(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	a := alpha.agent("a")
	require.Eventually(t, func() bool { return !alpha.node.LinkDown("beta.beam.directory") },
		30*time.Second, 20*time.Millisecond, "the link to beta comes up")
	require.False(t, alpha.node.LinkKnownDown("beta.beam.directory"))
	beta.stop()
	require.Eventually(t, func() bool { return alpha.node.LinkKnownDown("beta.beam.directory") },
		30*time.Second, 20*time.Millisecond, "the link to beta is known down")

	_, err := a.Send(context.Background(), "b@beta.beam.directory", "task", map[string]any{"n": 1})
	var aerr *agents.Error
	require.ErrorAs(t, err, &aerr)
	require.Equal(t, "DELIVERY_FAILED", aerr.Code, aerr.Message)
	require.Equal(t, http.StatusBadGateway, aerr.Status)
	require.Contains(t, aerr.Message, "Not sent to b@beta.beam.directory: its directory beta.beam.directory is unreachable from this one")
	counts, err := alpha.node.Outbox().Counts(context.Background())
	require.NoError(t, err)
	require.Zero(t, counts[Pending]+counts[Claimed]+counts[Published], "nothing waits to go out")
}
