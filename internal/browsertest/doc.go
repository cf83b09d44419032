// Package browsertest drives a headless Chromium (through chromedp) for the
// dashboard's browser tests: finding the binary, starting one browser per
// test, running steps with deadlines, waiting for page conditions and
// writing screenshots. It is imported only by tests; it starts no server
// and knows nothing of the dashboard's pages.
//
// It is an internal helper, not a public API.
package browsertest
