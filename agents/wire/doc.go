// Package wire is what Beam agents speak: Beam IDs and DIDs, Ed25519 key encodings, the beam/1 intent
// and result frames with their exact signing strings, the beam/2 compact-JWS envelope, and the canonical
// signatures of agent mutations.
//
// The beam/1 signing strings are defined by JavaScript: an intent is signed over
// JSON.stringify({type, from, to, intent, payload, timestamp, nonce}) of the parsed frame, a result over
// JSON.stringify of its recursively key-sorted fields. JSStringify and CanonicalJSON reproduce those bytes
// from raw wire JSON without going through Go maps, so key order, string escaping and number formatting
// match Node byte for byte (see fixtures/vectors-js for the vectors that pin this).
//
// beam/2 wraps the same frames in a compact JWS (EdDSA only, protected kid = the signer's Beam ID, typ
// TypIntentJWS or TypResultJWS, payload = the frame's JSON): SignIntentJWS / DecodeIntentJWS and
// SignResultJWS / DecodeResultJWS. Over WebSocket an intent travels as {"type":"intent","jws":…} and a
// result as {"type":"result","jws":…}; over HTTP the token is the body of POST /intents/send with
// Content-Type application/jose, and the result's token comes back in X-Beam-Result-JWS. A session
// announces beam/2 with protocol=beam/2 on /ws; docs/ARCHITECTURE.md ("beam/2") has the whole exchange.
//
// Payload bytes are kept exactly as received (IntentFrame.Payload, IntentFrame.Raw) and forwarded
// unchanged by DeliveryJSON; a round trip through map[string]any would reorder keys and break the
// recipient's signature check.
//
// Signing and verification are crypto/ed25519's Sign and Verify; the package has no curve arithmetic of
// its own.
//
// The package owns encoding, decoding, signing and verification only. It must not do I/O, keep state
// (no caches, pools or global maps: TestNoCurveArithmeticAndNoState checks its files), read clocks
// (callers pass time in) or know about the server: replay windows, nonces, ACLs and size policies beyond
// the bounds documented here belong to the directory.
//
// It is a public API: the wire formats, for SDKs and peers that speak beam's
// protocol.
package wire
