// Package cluster joins several `beam serve` nodes of one domain through a
// NATS cluster (beam serve --cluster); docs/ARCHITECTURE.md, "Cluster mode",
// has the whole design.
//
// The embedded NATS servers of the nodes are clustered with routes
// (ServerOptions) and run JetStream with its store inside each node's data
// directory; with --nats-url an external nats-server cluster with JetStream
// is used instead (its nodes' user: NodePermissions). Routes are TLS 1.3
// with node certificates of the cluster's own CA and a route password,
// which WriteNodeDirs (beam cluster init) puts in every node's data
// directory and LoadTrust reads (trust.go). The package owns the domain's JetStream resources, each
// replicated on min(3, nodes) servers (--cluster-replicas):
//
//   - the registry stream BEAM_REGISTRY_<domain token>: every registry
//     change of any node is one entry (directory/registry's Replicator);
//     every node applies the entries in stream order through the registry
//     (Apply), which records the position it reached in its own SQLite file,
//     so a node that was down catches up on start before it serves;
//   - the nodes bucket BEAM_NODES_<token> (membership, the dashboard's
//     view, and the nodes an origin asks to confirm a registry change);
//   - the sessions bucket BEAM_SESSIONS_<token> (agent → node holding its
//     session), watched into memory: directory.NodeRouter hands an intent,
//     a bus attempt or a pipeline hop for an agent another node holds to
//     that node over NATS request/reply;
//   - the nonces bucket BEAM_NONCES_<token>: a nonce accepted on one node
//     is refused on the others;
//   - each node's call subject: the bus and pipeline gateway requests
//     other nodes forward to it (busproxy.go, meshproxy.go), over NATS
//     rather than HTTP, and its stream subject: the envelope event streams
//     they forward (stream.go);
//   - the delivered bucket BEAM_DELIVERED_<token>: the acknowledgements of
//     bus messages, recorded by the node that received them before it
//     reports them, read before a message is delivered again
//     (delivered.go);
//   - the log stream BEAM_LOG_<token>: each node's event log, shipped
//     batch by batch before its appenders are acknowledged (logship.go),
//     and the takeover bucket BEAM_TAKEOVER_<token>: a lost node's log is
//     fenced, imported and adopted by one survivor (takeover.go).
//
// Registry entries, node, session, nonce and delivery entries, hand-overs,
// log batches, fences and takeover records, and the requests a node
// forwards to another (and their answers, each chunk of a forwarded stream
// too) are
// signed with the directory key
// every node holds (seal.go); a client of the NATS servers without that key
// cannot forge them.
//
// Each node keeps its own event log. The package must not write SQLite
// itself (the registry and the relay do, through the log's writer) and must
// not change how a single node works: without --cluster nothing here runs.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package cluster
