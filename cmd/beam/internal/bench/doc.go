// Package bench is the load generator behind `beam bench`: it registers real
// agents (each with its own Ed25519 key) with a directory, connects them over
// loopback WebSockets and HTTP, sends signed intents that the recipients
// verify and answer with signed results, and summarizes throughput, latency
// percentiles, errors and, when it can read the server's process, the
// server's CPU per intent and peak RSS.
//
// A mode is a Driver registered under a name (registerMode):
//
//   - ws: intents over the senders' WebSocket sessions;
//   - http: POST /intents/send;
//   - bus: durable sends (POST /v1/beam/send with the sender's signed
//     frame); the recipients answer over WebSocket, which acks the
//     message; the latency runs from the send to the ack, which the bus
//     reports on the sender's session (GET /v1/beam/messages/{id} is
//     polled when that notification is late). The summary adds the
//     messages accepted per second;
//   - federation: ws sends from senders on one directory (Config.URL,
//     named in Config.Domain) to recipients on a federated second one
//     (Config.PeerURL, Config.PeerDomain).
//
// A ws or http run over a cluster (Config.NodeURLs) registers and connects
// senders and recipients round-robin over its nodes, so most intents cross
// nodes, and reads every node's process (Config.NodePIDs): the server
// figures are summed over the nodes, and reported per node.
//
// The package also starts `beam serve` as a child process (StartServer),
// two federated ones (StartFederation), the nodes of a cluster
// (StartCluster), seeds an event log with many events
// (seedLog), times a restart on it (MeasureRestart) and runs the chaos
// scenario (RunChaos): a mixed durable load through the Go SDK while the
// server is SIGKILLed and restarted at seeded random points, followed by
// invariant checks on the stopped server's log.
//
// bench talks to the directory only over its public HTTP and WebSocket
// routes (directly or through the Go SDK, package agents) and reads /proc;
// it must not import the server's packages, so that what it measures is
// what an outside agent sees. The exceptions are package tracing, used by
// seedLog to write a log before any server runs on it and by RunChaos to
// check a stopped server's log, and package federation/cluster, whose
// WriteNodeDirs makes the data directories of a cluster's nodes (the
// directory key they share and their route credentials) before any of
// them runs, as beam cluster init does.
//
// It is not a public API: it belongs to the beam command.
package bench
