// Package srcscan walks the module's Go source for the tests that keep a
// rule about which package may do what (only tracing holds SQL on the log's
// tables; only internal/httpjson builds the Beam error shape). It parses
// files and nothing more: no type checking, no state. It is imported only
// by tests.
//
// It is an internal helper, not a public API.
package srcscan
