package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Federation sees the cluster as one directory: every node signs with, and
// peers pin, one directory key, so each node's data directory holds the
// same directory.key. The first node to start announces the key's public
// half in the bucket BEAM_CLUSTER_<token> (no TTL); a node whose key
// differs refuses to start.

// identityKey is the entry of the cluster bucket holding the directory's
// public key.
const identityKey = "directory-key"

// errDirectoryKeyMismatch is returned by Start when this node's directory
// key is not the one the cluster announces.
var errDirectoryKeyMismatch = errors.New("cluster: this node's directory key differs from the cluster's")

// CheckIdentity runs the directory key check (checkIdentity) through nc
// before Start, so that a refused node never subscribes to federation
// messages; Start then does not check again.
func (n *Node) CheckIdentity(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	if err := n.checkIdentity(ctx, js); err != nil {
		return err
	}
	n.identityChecked = true
	return nil
}

// checkIdentity announces cfg.DirectoryKey as the cluster's directory key
// when none is announced yet, and fails with errDirectoryKeyMismatch when
// another is.
func (n *Node) checkIdentity(ctx context.Context, js jetstream.JetStream) error {
	if n.cfg.DirectoryKey == "" {
		return nil
	}
	kv, err := createKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: "BEAM_CLUSTER_" + Token(n.cfg.Domain), Replicas: n.Replicas(), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return err
	}
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = kv.Create(attempt, identityKey, []byte(n.cfg.DirectoryKey))
		var announced string
		if errors.Is(err, jetstream.ErrKeyExists) {
			var e jetstream.KeyValueEntry
			if e, err = kv.Get(attempt, identityKey); err == nil {
				announced = string(e.Value())
			}
		}
		cancel()
		switch {
		case err == nil && (announced == "" || announced == n.cfg.DirectoryKey):
			return nil
		case err == nil:
			return fmt.Errorf("%w: this node has %s, the cluster %s; copy directory.key from another node's data directory",
				errDirectoryKeyMismatch, n.cfg.DirectoryKey, announced)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: announce the directory key: %w", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
