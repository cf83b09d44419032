// Package server composes a running beam directory from its parts: the event
// log, the directory, the bus, federation and the dashboard, behind one HTTP
// listener. It is not a public API: package beam at the module root maps
// its Config onto this one and calls New, and cmd/beam's serve goes through
// package beam; tests use New to run real directories in-process.
//
// server holds no business logic of its own beyond /health, /metrics and
// operator authentication; everything else is mounted from the packages that
// own it.
package server
