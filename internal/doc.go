// Package internal holds machinery of the beam binary that no outside user
// imports: the server composition (internal/server), build information
// (internal/buildinfo) and the test harness that starts real directories and
// agents (internal/beamtest).
package internal
