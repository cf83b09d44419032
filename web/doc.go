// Package web is beam's trace dashboard: an operator UI at /dashboard and
// the JSON and Server-Sent-Events endpoints it reads under /observability.
//
// # What it owns
//
//   - Operator sessions: a login form that exchanges the admin or viewer
//     token for an HttpOnly, SameSite=Strict session cookie (sessions live in
//     memory and expire), logout, a per-session CSRF token, a same-origin
//     check and a rate limit on failed logins. Scripts may instead send
//     "Authorization: Bearer <token>" to /observability/*.
//   - Read models computed on request from the event log's projections
//     (tracing.Log.Intents, Messages, …) and the agent registry: the overview
//     (outcome buckets, latency percentiles, timeline), the intent list, one
//     intent's trace, error pressure, agents, dead letters, federation.
//   - GET /observability/events/{nonce}: one nonce's events exactly as the
//     log holds them (an intent's, job:<id>, mesh:<id>), for beam trace
//     --url.
//   - GET /observability/stream: the log subscription as Server-Sent Events,
//     one event per log record with id = seq, resumable with Last-Event-ID
//     without gaps or duplicates.
//   - The UI itself: plain HTML, CSS and ES modules embedded with go:embed,
//     so neither Node nor a network is needed to build or serve it. It is
//     laid out for screens from 390 px wide (the sidebar folds behind a menu
//     button, tables stack) to wide monitors. A trace opens as a waterfall
//     (static/trace.js): each event a span on a proportional time axis,
//     attempts grouped, a failed attempt and its wait before the retry
//     drawn as such. Lists page with limit/offset; the overview asks for
//     hours=auto, a window picked from the age of the data, and splits
//     latency by owner (direct intents, bus messages).
//
// # What it must not do
//
// web never writes to the event log or to any table. Its only mutation is
// an operator action delegated to the component that owns the state: a
// dead-letter requeue calls Config.Requeue (provided by the message bus),
// and when no such function is configured the action is reported as
// unavailable, never faked. It does not define lifecycle states or buckets
// (tracing does), it does not relay intents, and it never exposes the admin
// or viewer token, agent API keys or private keys.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package web
