// Package server composes a running beam directory from its parts: the event
// log, the directory, the bus, federation and the dashboard, behind one HTTP
// listener. cmd/beam parses flags into a Config and calls New; tests use the
// same entry point to run real directories in-process.
//
// server holds no business logic of its own beyond /health, /metrics and
// operator authentication; everything else is mounted from the packages that
// own it.
package server
