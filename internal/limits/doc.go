// Package limits owns the server's resource limits that are not about one
// request's content: keyed token-bucket rate limits (per client address,
// per sending agent) and a listener that caps open connections, in total
// and per client address.
//
// It decides only whether something may proceed and for how long a client
// should wait; answering the client (429, Retry-After, the Beam error
// shape) is the caller's job. It must not import any beam package.
//
// It is an internal helper, not a public API.
package limits
