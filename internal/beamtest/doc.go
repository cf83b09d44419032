// Package beamtest starts real beam processes for tests: it builds the beam
// binary once per test binary (with the race detector when the tests run
// with it), runs `beam serve` on a random loopback port in a temporary data
// directory, and can stop it gracefully, SIGKILL it and start it again on
// the same data directory. Every line a process prints goes to the test's
// output, prefixed with its node name; Logger gives components a test
// starts in-process a logger that writes there too.
//
// A package that uses it calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(beamtest.Main(m)) }
//
// It is an internal helper, not a public API.
package beamtest
