// Package mesh runs pipelines of Asya-style envelopes through Beam agents:
// the directory is the gateway and the router. An envelope carries a route
// (prev, curr, next), headers and a payload; each hop is delivered to the
// actor agent (WebSocket session or HTTP endpoint) through the directory's
// delivery machinery, and the actor's answer moves the envelope on, fans it
// out, retries it by the actor's policy, or ends it in x-sink (and x-sump
// for dead letters). Every step is an event in the log (owner "mesh"); the
// envelope's status and progress are the beam_mesh projection.
//
// It owns the envelope type and its route rules (pure functions), the hop
// scheduler, retry policies (the JSON form of the attempt engine's, which
// decides each retry), deadline enforcement, the gateway HTTP + SSE
// API under /api/v1/mesh and the in-process hub of live events.
//
// It must not write SQL (the log's tables are read through tracing's query
// methods), must not keep state that is not rebuilt from the log (apart from
// ephemeral FLY events, subscriptions and a memo of decoded envelopes keyed by
// their bytes; the envelopes waiting for offline actors are rebuilt by
// Recover), must not judge a hop's admission itself (the directory's
// CheckPipelineHop is the relay's own policy check), and must not invent a
// transport:
// frames go through the directory.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package mesh
