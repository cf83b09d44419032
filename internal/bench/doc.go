// Package bench is the load generator behind `beam bench`: it registers real
// agents (each with its own Ed25519 key) with a directory, connects them over
// loopback WebSockets and HTTP, sends signed intents that the recipients
// verify and answer with signed results, and summarizes throughput, latency
// percentiles, errors and, when it can read the server's process, the
// server's CPU per intent and peak RSS.
//
// A mode is a Driver registered under a name (ws and http today; bus and
// federation plug in through RegisterMode when those packages exist). The
// package also starts `beam serve` as a child process (StartServer), seeds
// an event log with many events (SeedLog) and times a restart on it
// (MeasureRestart).
//
// bench only talks to the directory over its public HTTP and WebSocket
// routes and reads /proc; it must not import the server's packages, so that
// what it measures is what an outside agent sees. The one exception is
// SeedLog, which writes a log file through package tracing before any server
// runs on it.
package bench
