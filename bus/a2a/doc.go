// Package a2a serves the directory's declared pipelines to Agent2Agent
// (A2A) clients: protocol 1.0 over its JSON-RPC and HTTP+JSON bindings, and
// the 0.3 JSON-RPC methods and card fields for older clients.
//
// Each declared pipeline is an A2A agent with its own card under
// /a2a/pipelines/{name}; the directory's card at /.well-known/agent-card.json
// lists them as skills. A message to a pipeline creates an envelope through
// the mesh engine, and the task is that envelope: the task id is the
// envelope id, the task state follows the envelope's status, the final
// payload is the task's artifact. Callers authenticate as an agent (its API
// key, or the operator token naming the agent) and see only the tasks they
// created.
//
// Tasks' push notification configs (webhooks) are its one state: the table
// a2a_push_configs, written through the log's writer (Log.Do) and never
// part of an envelope; their webhooks are reached only through the
// directory's outbound client (public addresses unless
// AllowPrivateWebhooks).
//
// It owns the A2A wire shapes and their mapping to envelopes. It must not
// keep task state of its own (everything is read from the envelope's row in
// the log) and must not route envelopes itself: creating, cancelling and
// following them is the mesh engine's.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package a2a
