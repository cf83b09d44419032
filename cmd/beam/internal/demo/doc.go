// Package demo runs a handful of built-in agents against a directory so that
// a newcomer sees a living dashboard within seconds of `beam serve --demo`.
//
// The agents are real: each has its own key, registers through the HTTP API,
// holds an authenticated WebSocket session and signs every frame, exactly as
// an external agent would. Some intents succeed, some fail, some are accepted
// asynchronously, and one agent never connects, so messages sent to it
// through the bus wait in its inbox. Orders run through a pipeline of the
// agents (some succeed, one is refused, one waits in review), and a shop
// publishes jobs on the Intent Protocol job bus that a worker claims,
// fulfills or fails.
//
// demo must not reach into the directory's internals: it only uses the
// public agent SDK (package agents), the pipeline gateway and the job bus
// over HTTP as any client would.
//
// It is not a public API: it belongs to the beam command.
package demo
