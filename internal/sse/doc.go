// Package sse writes Server-Sent Events (the text/event-stream format of
// the HTML standard): the response headers, events with optional name and
// id, comments and the retry field. It is the one SSE writer of the mesh
// events route, the A2A streams and the dashboard's live feed.
//
// It is an internal helper, not a public API.
package sse
