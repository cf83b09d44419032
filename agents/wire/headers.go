package wire

// HTTP header names of the Beam protocol, one definition for the SDK and
// the server. Go canonicalizes header names (http.Header.Get and Set), so
// the spelling here is the one written on the wire; readers match any case.
const (
	// HeaderBeamID, HeaderTimestamp, HeaderNonce and HeaderSignature carry
	// a signed request: the signer's Beam ID, its RFC 3339 timestamp, a
	// fresh nonce and the Ed25519 signature over the request's canonical
	// JSON (the pipeline gateway's and the registry's signed requests).
	HeaderBeamID    = "X-Beam-Id"
	HeaderTimestamp = "X-Beam-Timestamp"
	HeaderNonce     = "X-Beam-Nonce"
	HeaderSignature = "X-Beam-Signature"
	// HeaderSender names the sender of an intent the directory delivers to
	// an agent's webhook (with HeaderSignature, HeaderNonce and
	// HeaderTimestamp of the frame).
	HeaderSender = "X-Beam-Sender"
	// HeaderResultJWS carries the beam/2 result token of a synchronous
	// POST /intents/send; HeaderIntentJWS the beam/2 intent token a webhook
	// delivery carries.
	HeaderResultJWS = "X-Beam-Result-JWS"
	HeaderIntentJWS = "X-Beam-Intent-JWS"
	// HeaderAttestation and HeaderAttestationKey carry a directory's
	// attestation of a delivered intent and the key that signed it.
	HeaderAttestation    = "X-Beam-Attestation"
	HeaderAttestationKey = "X-Beam-Attestation-Key"
	// HeaderProtocol, HeaderPipeline and HeaderA2AContext are keys of a
	// pipeline envelope's headers (MeshEnvelope.Headers, not HTTP) set by the
	// A2A and MCP gateways: the protocol the envelope came in by, the
	// declared pipeline it runs, and the A2A context id.
	HeaderProtocol   = "x-beam-protocol"
	HeaderPipeline   = "x-beam-pipeline"
	HeaderA2AContext = "x-beam-a2a-context"
)
