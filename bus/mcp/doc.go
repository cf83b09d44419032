// Package mcp serves the directory's declared pipelines as tools of a
// Model Context Protocol server over Streamable HTTP at /mcp, on the
// official Go SDK (github.com/modelcontextprotocol/go-sdk).
//
// A tool is named as its pipeline and takes the pipeline's input schema; a
// call creates an envelope through the mesh engine as the calling agent,
// reports a progress notification each time the envelope's progress grows
// (as its hops complete), and answers the final payload as structured
// content. A call the client cancels (or abandons) cancels the envelope.
//
// It must not keep state of its own beyond the SDK's sessions (bounded by
// an idle timeout), and must not route envelopes itself.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package mcp
