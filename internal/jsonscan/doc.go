// Package jsonscan holds the JSON string primitives the module's hand-written
// scanners and writers share: scanning a string token, decoding its escapes
// and escaping the bytes JSON requires escaped. Each caller keeps its own
// rules for what lies around them (agents/wire: JSON.stringify and WTF-8;
// tracing: the Rebuild fold; directory: the WebSocket envelope).
//
// It must not allocate on its scan paths, import anything of the module, or
// grow a parser: it is the shared bottom layer, fuzzed against encoding/json.
//
// It is an internal helper, not a public API.
package jsonscan
