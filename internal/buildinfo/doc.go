// Package buildinfo reports the version of the running beam binary.
//
// It is an internal helper, not a public API.
package buildinfo
