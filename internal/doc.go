// Package internal holds the leaves every package of the module may import
// and no outside user imports: small helpers the domain packages share
// (httpjson, limits, jsonscan, dirlock, sse, replay, tricks, buildinfo,
// testclock), and the test bundles that start real directories and agents
// (beamtest, apitest, browsertest, lifecycletest). A leaf imports no package
// of the module outside internal/ but agents/wire and attempt; nothing
// sits on top of the domain packages here (the assembly is package beam at
// the module root, beam bench and serve --demo are cmd/beam's own).
// TestLayoutReadsOneWay at the module root keeps it so.
//
// It is an internal helper, not a public API.
package internal
