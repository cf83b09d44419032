// Package cluster joins several `beam serve` nodes of one domain through a
// NATS cluster (beam serve --cluster).
//
// The embedded NATS servers of the nodes are clustered with routes
// (ServerOptions) and run JetStream with its store inside each node's data
// directory; with --nats-url an external nats-server cluster with JetStream
// is used instead. The package owns the JetStream resources of the domain:
//
//   - the registry stream BEAM_REGISTRY_<domain token> on the subject
//     beam.cluster.<domain token>.registry, replicated on
//     min(3, nodes) servers (--cluster-replicas). Every registry change of
//     any node is one entry (directory/registry's Replicator); every node
//     applies the entries in stream order through the registry (Apply),
//     which records the position it reached in its own SQLite file, so a
//     node that was down catches up on start before it serves.
//
// Each node keeps its own event log. The package must not write SQLite
// itself (the registry does, through the log's writer) and must not change
// how a single node works: without --cluster nothing here runs.
package cluster
