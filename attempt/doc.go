// Package attempt is the delivery-attempt engine every owner of work in beam
// uses: the message bus, pipelines, Intent Protocol jobs, the federation
// outbox and relay. It holds what each of them would otherwise write for
// itself:
//
//   - Policy and Backoff: when the next attempt is due after a failure
//     (a fixed schedule, constant, linear or exponential growth, a cap, a
//     jitter) and when attempts stop and the item is dead-lettered
//     (Decide);
//   - Due: items ordered by the time they are due, for retries that wait
//     and leases that expire;
//   - Keyed: serialization of the state changes of one key (a nonce, an
//     envelope id) without one lock per key;
//   - Loop: the start/tick/kick/close service that drives an owner's due
//     work.
//
// The package records nothing: the owner of an item appends its events to
// the log and decides what a dead letter is. It is not a public API; it is
// exported for beam's own packages.
package attempt
