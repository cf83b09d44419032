// Package dirlock owns the exclusive lock on a beam data directory: one
// file, beam.lock, locked with flock(2) and holding the PID of its holder.
// A process that writes the data directory (beam serve, beam replay, beam
// import) takes the lock before it opens anything else there, so a second
// writer is refused before it can run recovery on a live log.
//
// It must not open the log or any other file of the data directory; it
// only decides who may.
//
// It is an internal helper, not a public API.
package dirlock
