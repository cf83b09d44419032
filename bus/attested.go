package bus

import (
	"errors"
	"net/http"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Attestation on the bus: a message its sender did not sign (API key, bus
// key, beam/2 JWS) is delivered as a frame the directory signs with its
// attestation key (directory.Deliver); the dispatched event of such an
// attempt carries details.attestation. A recipient that requires sender
// signatures gets no such message: the send is refused (403
// SENDER_SIGNATURE_REQUIRED), and a message queued before the recipient
// turned the setting on is dead-lettered with that code instead of being
// delivered attested.

// errEndToEnd: the recipient requires sender signatures and the message
// has none.
var errEndToEnd = errors.New("the recipient requires end-to-end sender signatures")

// checkEndToEnd refuses a send to a local recipient that requires sender
// signatures unless the sender signed the beam/1 frame itself.
func (b *Bus) checkEndToEnd(req *sendRequest) *httpjson.Error {
	if req.auth == directory.BusAuthSignature && req.frame != nil {
		return nil
	}
	if rcpt, ok := b.reg.Get(req.to); !ok || !rcpt.RequireSenderSignatures {
		return nil
	}
	return httpjson.Errorf(http.StatusForbidden, directory.CodeSenderSignatureRequired, "%s",
		directory.SenderSignatureRequired(req.to, req.auth))
}

// attestation returns the details of an attempt whose frame is unsigned
// (and so attested by the directory) for a sender authenticated by auth;
// nil for a sender-signed frame.
func (b *Bus) attestation(signed bool, auth string) map[string]any {
	if signed {
		return nil
	}
	return map[string]any{"attestation": b.dir.AttestationDetails(auth)}
}

// dispatchedWith sets the attestation details of a dispatched event.
func (b *Bus) dispatchedWith(ev tracing.Event, signed bool, auth string) tracing.Event {
	if extra := b.attestation(signed, auth); extra != nil {
		ev.Details.Extra = extra
	}
	return ev
}
