package beam

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
)

// clusterJoinTimeout bounds the wait for the cluster to form at start.
const clusterJoinTimeout = 2 * time.Minute

// ErrLogTakenOver is the error of New, and TakenOver is closed, when
// another node of the cluster took this node's event log over (its node
// was gone long enough): the directory must not serve that log again.
// beam serve then sets the log file aside and starts again with a new,
// empty log.
var ErrLogTakenOver = errors.New("this node's event log was taken over by another node of the cluster")

// TakenOver is closed when another node took this node's log over while
// it served; the caller then shuts it down (ErrLogTakenOver). Nil on a
// single node.
func (s *Server) TakenOver() <-chan struct{} {
	if s.cluster == nil {
		return nil
	}
	return s.cluster.Fenced()
}

// openCluster prepares the cluster node when cluster mode is on: the
// embedded NATS server (started by federation) then gets its options.
func (s *Server) openCluster(agents *registry.Registry, dir *directory.Directory, router *cluster.Router) error {
	c := s.cfg.Cluster
	if !c.Enabled {
		return nil
	}
	if s.cfg.Domain == "" {
		return errors.New("cluster mode needs --domain")
	}
	if s.cfg.Federation.NATSListen == "" && s.cfg.Federation.NATSURL == "" {
		s.cfg.Federation.NATSListen = "127.0.0.1:0"
	}
	id := c.NodeID
	if id == "" {
		var err error
		if id, err = cluster.LoadOrCreateNodeID(s.cfg.DataDir); err != nil {
			return err
		}
	}
	// Peers see the cluster as one directory: every node holds the same
	// directory key, checked against the one the cluster announces.
	key, _, err := federation.LoadOrCreateKey(s.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	listen := c.Listen
	if s.cfg.Federation.NATSURL != "" {
		listen = ""
	}
	// The embedded server's routes need the credentials beam cluster init
	// wrote into the data directory; without them the node does not start.
	var trust *cluster.Trust
	if s.cfg.Federation.NATSURL == "" {
		if trust, err = cluster.LoadTrust(s.cfg.DataDir); err != nil {
			return err
		}
	}
	node, err := cluster.New(cluster.Config{
		Domain: s.cfg.Domain, NodeID: id, Listen: listen, Routes: c.Routes, Replicas: c.Replicas, Trust: trust,
		StoreDir: filepath.Join(s.cfg.DataDir, "jetstream"), Registry: agents, Directory: dir, Router: router, Sessions: dir.ConnectedAgents, Logger: s.logger,
		DirectoryKey: federation.EncodeKey(key.Public().(ed25519.PublicKey)), Key: key, Registerer: s.registry,
		JobBus: s.cfg.JobBus.Enabled, LogID: s.log.ID(), Log: s.shipped, Adopt: s.shipped.Adopt,
		TakeoverGrace: c.TakeoverGrace,
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	s.cluster = node
	s.repl.node.Store(node)
	return nil
}

// natsServerOptions is federation's hook for the embedded server's options.
func (s *Server) natsServerOptions() func(*server.Options) {
	if s.cluster == nil {
		return nil
	}
	return s.cluster.ServerOptions
}

// clusterIdentity is federation's hook before it subscribes: a node whose
// directory key differs from the cluster's fails here, before it joins the
// federation queue group. Nil on a single node.
func (s *Server) clusterIdentity(ctx context.Context) func(*nats.Conn) error {
	if s.cluster == nil {
		return nil
	}
	return func(nc *nats.Conn) error {
		ctx, cancel := context.WithTimeout(ctx, clusterJoinTimeout)
		defer cancel()
		return s.cluster.CheckIdentity(ctx, nc)
	}
}

// startCluster joins the cluster once federation's NATS connection is up
// and catches the registry up before anything is served.
func (s *Server) startCluster(ctx context.Context) error {
	if s.cluster == nil {
		return nil
	}
	jctx, cancel := context.WithTimeout(ctx, clusterJoinTimeout)
	defer cancel()
	if err := s.cluster.Start(jctx, s.fed.Conn()); err != nil {
		if errors.Is(err, cluster.ErrFenced) {
			return fmt.Errorf("%w: %w", ErrLogTakenOver, err)
		}
		return err
	}
	s.logger.Info("cluster", "node", s.cluster.NodeID(), "replicas", s.cluster.Replicas())
	return nil
}

// clusterNode is the cluster node, or nil when cluster mode is off.
func (s *Server) clusterNode() *cluster.Node { return s.cluster }

// clusterStatus is the dashboard's view of the cluster; nil on a single
// node.
func (s *Server) clusterStatus() func(context.Context) (any, error) {
	if s.cluster == nil {
		return nil
	}
	return s.cluster.Status
}

// clusterHandler lets the bus's poll and ack routes reach every node's
// messages, and the pipeline gateway every node's envelopes, in cluster
// mode; h itself on a single node.
func (s *Server) clusterHandler(h http.Handler) http.Handler {
	if s.cluster == nil {
		return h
	}
	if s.mesh != nil {
		s.cluster.MeshAuth(s.mesh.Principal)
	}
	return s.cluster.BusHandler(h, func(r *http.Request) (directory.BusPrincipal, bool) { return s.bus.Principal(r) })
}

// federationQueue is the queue group in which the nodes of a cluster take
// federation messages, one node each; "" on a single node.
func (s *Server) federationQueue() string {
	if s.cluster == nil {
		return ""
	}
	return "beam-fed-" + cluster.Token(s.cfg.Domain)
}
