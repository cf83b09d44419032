// Package attest owns a directory's attestation key and the one way the
// directory vouches for a frame its sender did not sign: it signs the
// ordinary beam/1 signing string with the attestation key, delivers the
// key as senderPublicKey and marks the message with an "attestation"
// member (agents/wire.Attestation). The bus (API-key and bus-key sends),
// the relay (API-key sessions), federation (frames a peer vouches for) and
// any later producer of unsigned frames go through Attester.Attest, and the
// key is published at wire.AttestationKeysPath so that receivers can tell
// an attested frame from a sender-signed one.
//
// The attestation key is its own Ed25519 key, stored as
// <data-dir>/attestation.key (base64url seed, mode 0600, created on first
// start, the same file format as the federation directory.key). It is
// deliberately not the directory key: that key also answers NATS
// authentication challenges chosen by peer servers, and a signature the
// directory makes over someone else's bytes must never be readable as an
// attestation.
//
// The package must not deliver, record or route anything: it signs frames
// it is given and serves the public half of its key.
//
// It is not a public API: it is one part of the directory that package beam
// assembles; embed the directory through package beam.
package attest
