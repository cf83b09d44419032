// Package httpjson owns how beam's HTTP endpoints answer in JSON: the
// encoding of a response body, the Beam error shape
// {"error": "...", "errorCode": "..."} with its one error type (Error) and
// one handler adapter (Adapter), and reading credentials from request
// headers (bearer tokens and agent API keys).
//
// Every package that serves HTTP writes through it, so every endpoint sets the
// same headers, escapes the same way and parses tokens the same way. It knows
// nothing of agents, intents or the log, and must not: protocol-specific error
// shapes (the Intent Protocol's {"error":{"code","message"}}) live with their
// protocol and plug into the Adapter as its Shape.
//
// It is an internal helper, not a public API.
package httpjson
