// Package tricks holds the one off switch for the speed tricks that reach
// beneath a library (each lives in its own internal package). Setting
// BEAM_TRICKS_OFF to a comma-separated list of trick names, or to "all",
// turns those tricks off for the process: the code then takes the plain
// path through the library. It exists so that every trick can be measured
// on and off in the same minutes (docs/BENCHMARKS.md) and dropped the day it
// no longer pays.
//
// It is an internal helper, not a public API.
package tricks
