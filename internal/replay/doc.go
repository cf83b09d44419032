// Package replay holds Set, the in-memory replay-nonce set: one-time values
// (nonces of signed requests and connect tokens) remembered until they
// expire, so a captured request cannot be played again inside its window.
// The job bus's signed requests and the directory's signed WebSocket
// connects use it; stores that must outlive the process (the job bus's
// SQLite table, the event log, the cluster's key-value bucket) keep their
// own storage and put this set in front or claim there directly.
//
// It is an internal helper, not a public API.
package replay
