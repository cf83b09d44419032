// Package apitest holds what the packages' tests do the same way against a
// running directory: registering an agent over HTTP with a key the test
// holds, and reading a nonce's states from the log. It is imported only by
// tests and starts nothing itself.
//
// It is an internal helper, not a public API.
package apitest
