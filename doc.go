// Package beam embeds a Beam agent directory in a Go program.
//
// A directory registers agents' Ed25519 identities, relays their signed
// intents over WebSocket and HTTP, delivers durable messages through its bus,
// federates with peer directories over NATS and serves a trace dashboard,
// all on one append-only event log in a SQLite file in its data directory.
// The beam command's `serve` is this package behind flags: it builds a
// Config from them (each flag sets one of its fields, the job bus, cluster,
// pipelines, timeouts and limits in nested structs) and calls New, which is
// the assembly itself:
//
//	srv, err := beam.New(ctx, beam.Config{DataDir: "./beam-data", JobBus: beam.JobBus{Enabled: true}})
//	if err != nil {
//		return err
//	}
//	defer srv.Shutdown(ctx)
//	jobLn, err := net.Listen("tcp", "127.0.0.1:3200")
//	if err != nil {
//		return err
//	}
//	go srv.ServeJobBus(jobLn)
//	ln, err := net.Listen("tcp", "127.0.0.1:3100")
//	if err != nil {
//		return err
//	}
//	return srv.Serve(ln)
//
// Agents talk to it with the Go SDK in package agents (or the published
// TypeScript SDK). The packages under the module root own the parts
// (tracing, directory, bus, federation, web); this package only assembles
// them behind one HTTP listener and must not grow behaviour of its own
// beyond /health, /metrics, /openapi.json, the operator-only profiles and
// operator authentication. It
// sits on top: no package of the module but cmd/beam imports it
// (TestLayoutReadsOneWay).
//
// It is a public API: embedders build a directory with New and a Config; `beam
// serve` is this package behind flags.
package beam
