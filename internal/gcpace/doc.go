// Package gcpace sets how far the Go heap may grow between collections in
// bytes rather than only in proportion to the live heap. It is not a
// public API: its one entry is Run, which `beam serve` starts.
//
// With the runtime's default (GOGC=100) the heap may grow by as much as is
// live before the next collection. Both ends of that go wrong for a
// directory:
//
//   - A busy directory with few sessions has a live heap of a few MiB and
//     allocates tens of MiB a second, so the default collects it dozens of
//     times a second. Run lets such a heap grow by 32 MiB: at 64 intents in
//     flight that takes about a tenth off the server's CPU per intent, for
//     some MiB more RSS (docs/BENCHMARKS.md, "Speed tricks beneath the
//     libraries").
//   - A directory holding many idle sessions has a large live heap that
//     allocates little, so the headroom is mostly memory the process keeps
//     for nothing. Run lowers the GC percentage so the heap grows by about
//     32 MiB between collections while the live heap is larger than that
//     and the process allocates slowly.
//
// When the heap holds much more than its goal and the process has gone
// quiet (many agents have just disconnected, say), Run returns those pages
// to the system at once; the runtime's scavenger would take minutes.
//
// It changes only the process's GC percentage, and does nothing when the
// operator set GOGC or when BEAM_TRICKS_OFF names gcpace (or says all;
// package internal/tricks): the runtime's own pacing then stands. It
// imports no beam package but internal/tricks.
package gcpace
