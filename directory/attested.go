package directory

import (
	"encoding/json"
	"fmt"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/attest"
)

// Attestation of frames their sender did not sign (package attest). Every
// path that hands a frame to a recipient — a relayed intent over WebSocket
// or direct HTTP, a bus attempt — calls handOver, which leaves a signed
// frame (beam/1 signature or beam/2 JWS) as it is and signs an unsigned one
// with the directory's attestation key.

// handOver is what a recipient gets for one frame: the frame to deliver,
// the key to send as senderPublicKey and, for an attested frame, its
// attestation member.
type handOver struct {
	frame     *wire.IntentFrame
	senderKey string
	attested  *wire.Attestation
}

// handOver attests f when it carries no sender signature (and no beam/2
// JWS, which the recipient verifies itself); auth and vouchedBy say how
// the sender was authenticated. senderKey is the sender's registered key,
// delivered for frames the sender signed.
func (d *Directory) handOver(f *wire.IntentFrame, senderKey, jws, auth, vouchedBy string) (handOver, error) {
	if f.Signature != "" || jws != "" {
		return handOver{frame: f, senderKey: senderKey}, nil
	}
	g, member, err := d.attester.Attest(f, auth, vouchedBy)
	if err != nil {
		return handOver{}, err
	}
	return handOver{frame: g, senderKey: d.attester.PublicKey(), attested: &member}, nil
}

// details returns the trace details of the hand-over: {"attestation":…}
// for an attested frame, merged into extra; extra unchanged otherwise.
func (h handOver) details(extra map[string]any) map[string]any {
	if h.attested == nil {
		return extra
	}
	return withExtra(extra, "attestation", attestationDetails(*h.attested))
}

func attestationDetails(a wire.Attestation) map[string]any {
	d := map[string]any{"by": a.By, "keyId": a.KeyID, "auth": a.Auth}
	if a.VouchedBy != "" {
		d["vouchedBy"] = a.VouchedBy
	}
	return d
}

// message builds the WebSocket intent message of the hand-over:
// {"type":"intent","frame":…,"senderPublicKey":…[,"attestation":…]}.
func (h handOver) message() ([]byte, error) {
	msg, err := intentMessage(h.frame, h.senderKey)
	if err != nil || h.attested == nil {
		return msg, err
	}
	return appendMember(msg, "attestation", *h.attested)
}

// appendMember adds "key":v as the last member of the JSON object msg.
func appendMember(msg []byte, key string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s member: %w", key, err)
	}
	out := make([]byte, 0, len(msg)+len(key)+len(b)+4)
	out = append(out, msg[:len(msg)-1]...)
	out = append(out, ',', '"')
	out = append(out, key...)
	out = append(out, '"', ':')
	out = append(out, b...)
	return append(out, '}'), nil
}

// attestAuth is the attestation auth of an unsigned frame the relay
// accepted: vouched for by a peer directory, or sent on a session the
// agent opened with its API key.
func attestAuth(vouchedBy string) string {
	if vouchedBy != "" {
		return wire.AttestPeer
	}
	return wire.AttestAPIKey
}

// Attester returns the directory's attester (its key is published at
// wire.AttestationKeysPath).
func (d *Directory) Attester() *attest.Attester { return d.attester }

// AttestationDetails returns the trace details the bus records with an
// attempt whose frame the directory will attest ({"by","keyId","auth"}).
func (d *Directory) AttestationDetails(auth string) map[string]any {
	return d.attester.Details(auth, "")
}

// protocol is what the session speaks: beam/2 when it announced it, else
// beam/1.
func (s *session) protocol() string {
	if s.beam2 {
		return "beam/2"
	}
	return "beam/1"
}

// CodeSenderSignatureRequired: the recipient requires end-to-end sender
// signatures (its requireSenderSignatures setting) and the intent would
// have been delivered attested by the directory instead (403).
const CodeSenderSignatureRequired = "SENDER_SIGNATURE_REQUIRED"

// SenderSignatureRequired returns the message of a refusal with
// CodeSenderSignatureRequired, naming the setting and how the sender was
// authenticated.
func SenderSignatureRequired(to, auth string) string {
	return fmt.Sprintf("%s requires end-to-end sender signatures (its requireSenderSignatures setting is on); "+
		"a frame authenticated by %s would reach it signed by the directory, not by the sender: send a frame "+
		"signed with the sender's key", to, auth)
}

// checkEndToEnd refuses an authentic frame that would be attested (no
// sender signature, no beam/2 JWS) when its local recipient requires
// sender signatures.
func (d *Directory) checkEndToEnd(f *wire.IntentFrame, jws, vouchedBy string) (code, msg string) {
	if f.Signature != "" || jws != "" {
		return "", ""
	}
	if a, ok := d.reg.Get(f.To); ok && a.RequireSenderSignatures {
		return CodeSenderSignatureRequired, SenderSignatureRequired(f.To, attestAuth(vouchedBy))
	}
	return "", ""
}
