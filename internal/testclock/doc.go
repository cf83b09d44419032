// Package testclock is the settable clock tests inject wherever a package
// takes a clock (func() time.Time): time moves only when the test says so.
// It is imported only by tests.
//
// It is an internal helper, not a public API.
package testclock
