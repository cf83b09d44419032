// Package gcpace sets how far the Go heap may grow between collections in
// bytes rather than only in proportion to the live heap.
//
// With the runtime's default (GOGC=100) the heap may grow by as much as is
// live before the next collection. Both ends of that go wrong for a
// directory:
//
//   - A directory holding many idle sessions has a large live heap that
//     allocates little, so the headroom is mostly memory the process keeps
//     for nothing: with 19,000 idle agents and light traffic, pacing it
//     took 16-27 % off the server's RSS. Run lowers the GC percentage so
//     the heap grows by about Headroom bytes between collections while
//     the live heap is larger than that and the process allocates slowly.
//   - A busy directory with few sessions has a live heap of a few MiB and
//     allocates tens of MiB a second, so the default collects it dozens of
//     times a second. Run lets such a heap grow by Headroom: at 64 intents
//     in flight that took 9 % off the server's CPU per intent, for about
//     30 MiB more RSS.
//
// When the heap holds much more than its goal and the process has gone
// quiet (19,000 agents have just disconnected, say), Run returns those
// pages to the system at once; the runtime's scavenger would take minutes.
//
// It changes only the process's GC percentage and leaves it alone when the
// operator set GOGC. It must not import any beam package.
package gcpace
