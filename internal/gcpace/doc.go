// Package gcpace bounds how far the Go heap may grow between collections
// in bytes, once the live heap is large.
//
// With the runtime's default (GOGC=100) the heap may grow by as much as is
// live before the next collection, and the runtime keeps the pages it
// grew into. A directory holding many idle sessions has a large live heap
// that allocates little, so that headroom is mostly memory the process
// keeps for nothing: with 19,000 idle agents and light traffic, pacing it
// took 16-27 % off the server's RSS. Run lowers the GC percentage so the
// heap grows by about Headroom bytes between collections while the live
// heap is larger than that and the process allocates slowly, and leaves
// the default for small heaps and busy processes.
//
// It changes only the process's GC percentage and leaves it alone when the
// operator set GOGC. It must not import any beam package.
package gcpace
