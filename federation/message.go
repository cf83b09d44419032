package federation

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Kinds of federation messages. Each travels on its own subject.
const (
	// kindIntent forwards an agent's intent frame to the recipient's
	// directory; the reply is a kindResult.
	kindIntent = "intent"
	// KindResolve asks a directory for the current key of one of its
	// agents; the reply is a kindResult carrying the key.
	KindResolve = "resolve"
	// kindResult answers a request: the outcome of a forwarded intent
	// (the recipient's result frame, or the target directory's error) or a
	// resolved key.
	kindResult = "result"
)

// TypMessage is the JWS "typ" of every federation message.
const TypMessage = "beam-fed+jws"

// Limits of federation messages.
const (
	// maxMessageBytes bounds one compact JWS on the wire.
	maxMessageBytes = 256 << 10
	// maxHops is the most directories an intent may cross.
	maxHops = 3
	// maxClockSkew is how far a message's iat may be ahead of local time.
	maxClockSkew = time.Minute
	// maxMessageTTL bounds exp - iat.
	maxMessageTTL = 10 * time.Minute
)

// Message is the signed payload of a federation message. Its jti is unique
// per envelope (replay protection); EventID is stable across the publish
// attempts of one outbox row (receivers deduplicate work on it and on the
// intent's nonce).
type Message struct {
	Kind     string `json:"kind"`
	ID       string `json:"jti"`
	From     string `json:"from"`
	To       string `json:"to"`
	IssuedAt int64  `json:"iat"` // unix ms
	Expires  int64  `json:"exp"` // unix ms
	// Re is the jti of the request a result answers.
	Re string `json:"re,omitempty"`
	// EventID is the outbox event a forwarded intent belongs to.
	EventID string `json:"eventId,omitempty"`

	// Intent forwarding.
	Nonce     string   `json:"nonce,omitempty"`
	Frame     string   `json:"frame,omitempty"` // the agent's frame, verbatim
	Hop       int      `json:"hop,omitempty"`
	Path      []string `json:"path,omitempty"` // directories crossed so far, origin first
	TimeoutMs int64    `json:"timeoutMs,omitempty"`
	Owner     string   `json:"owner,omitempty"`
	// Admitted is when the origin admitted a durable (bus-owned) frame,
	// unix ms: the target checks the frame's replay window against it.
	Admitted int64 `json:"admitted,omitempty"`
	// VouchedAuth is how the origin authenticated the sender of an
	// unsigned frame (api-key, bus-key, jws); the target records it with
	// the attested delivery.
	VouchedAuth string `json:"vouchedAuth,omitempty"`
	// JWS is the sender's beam/2 envelope of the intent (Frame is its
	// payload), verified by the target against the sender's key.
	JWS string `json:"jws,omitempty"`

	// Results.
	Status    string `json:"status,omitempty"` // statusResult or statusError
	ErrorCode string `json:"errorCode,omitempty"`
	Error     string `json:"error,omitempty"`
	Result    string `json:"result,omitempty"` // a result frame, verbatim
	Delivered bool   `json:"delivered,omitempty"`
	// ResultJWS is the recipient's beam/2 result JWS (Result is its
	// payload), verbatim.
	ResultJWS string `json:"resultJws,omitempty"`

	// Resolution.
	BeamID    string `json:"beamId,omitempty"`
	PublicKey string `json:"publicKey,omitempty"` // base64 SPKI DER, as registered
}

// Statuses of a kindResult.
const (
	// statusResult: the recipient (or its directory, for a failure it
	// committed) produced Result; the outcome is final.
	statusResult = "result"
	// statusError: the target directory refused or could not handle the
	// request; ErrorCode says whether trying again may help.
	statusError = "error"
)

// newID returns 16 random bytes in hex.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// seal signs m as a compact JWS with the directory key; kid is m.From.
func seal(m *Message, priv ed25519.PrivateKey) ([]byte, error) {
	payload, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", m.Kind, err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{
		Algorithm: jose.EdDSA,
		Key:       jose.JSONWebKey{Key: priv, KeyID: m.From, Algorithm: string(jose.EdDSA)},
	}, (&jose.SignerOptions{}).WithType(TypMessage))
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", m.Kind, err)
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", m.Kind, err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", m.Kind, err)
	}
	if len(tok) > maxMessageBytes {
		return nil, fmt.Errorf("seal %s: %d bytes exceeds %d", m.Kind, len(tok), maxMessageBytes)
	}
	return []byte(tok), nil
}

// Reasons a federation message is rejected (label of
// beam_federation_rejected_total).
const (
	rejectMalformed    = "malformed"
	rejectUnpinned     = "unpinned"
	rejectBadSignature = "bad_signature"
	rejectStale        = "stale"
	rejectReplay       = "replay"
	rejectMisaddressed = "misaddressed"
	rejectPermission   = "permission"
	rejectHops         = "hop_limit"
	rejectLoop         = "loop"
	rejectSender       = "sender"
	rejectReply        = "reply"
)

// rejectError is why a federation message was not accepted.
type rejectError struct {
	// Reason is one of the Reject* constants.
	Reason string
	// Msg says what was wrong.
	Msg string
}

func (e *rejectError) Error() string {
	return "federation message rejected (" + e.Reason + "): " + e.Msg
}

func rejectf(reason, format string, args ...any) *rejectError {
	return &rejectError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// keyOf returns the pinned key of a peer domain, or false.
type keyOf func(domain string) (ed25519.PublicKey, bool)

// open verifies a federation message: EdDSA only, one signature, typ
// TypMessage, kid a pinned peer (and equal to wantFrom when set), no
// embedded keys, a payload whose from equals the kid, to equals self, kind
// equals wantKind, and a fresh iat/exp at now. Replay of the jti is the
// caller's check.
func open(token []byte, self, wantFrom, wantKind string, keys keyOf, now time.Time) (*Message, error) {
	if len(token) > maxMessageBytes {
		return nil, rejectf(rejectMalformed, "%d bytes exceeds %d", len(token), maxMessageBytes)
	}
	obj, err := jose.ParseSignedCompact(string(token), []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, rejectf(rejectMalformed, "not a compact EdDSA JWS: %v", err)
	}
	if len(obj.Signatures) != 1 {
		return nil, rejectf(rejectMalformed, "want one signature, got %d", len(obj.Signatures))
	}
	h := obj.Signatures[0].Protected
	if h.JSONWebKey != nil {
		return nil, rejectf(rejectMalformed, "embedded jwk is not allowed")
	}
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != TypMessage {
		return nil, rejectf(rejectMalformed, "typ %q, want %q", typ, TypMessage)
	}
	kid := h.KeyID
	if wantFrom != "" && kid != wantFrom {
		return nil, rejectf(rejectUnpinned, "signed as %q on the subject of %q", truncate(kid), wantFrom)
	}
	pub, ok := keys(kid)
	if !ok {
		return nil, rejectf(rejectUnpinned, "no pinned key for %q", truncate(kid))
	}
	payload, err := obj.Verify(pub)
	if err != nil {
		return nil, rejectf(rejectBadSignature, "signature of %q does not verify with its pinned key", kid)
	}
	var m Message
	if err := json.Unmarshal(payload, &m); err != nil {
		return nil, rejectf(rejectMalformed, "payload: %v", err)
	}
	switch {
	case m.From != kid:
		return nil, rejectf(rejectMisaddressed, "from %q signed by %q", truncate(m.From), kid)
	case m.To != self:
		return nil, rejectf(rejectMisaddressed, "addressed to %q, not %q", truncate(m.To), self)
	case m.Kind != wantKind:
		return nil, rejectf(rejectMisaddressed, "kind %q on a %q subject", truncate(m.Kind), wantKind)
	case m.ID == "" || len(m.ID) > 64:
		return nil, rejectf(rejectMalformed, "jti missing or too long")
	}
	iat, exp := time.UnixMilli(m.IssuedAt), time.UnixMilli(m.Expires)
	switch {
	case iat.After(now.Add(maxClockSkew)):
		return nil, rejectf(rejectStale, "issued in the future (%s)", iat.UTC().Format(time.RFC3339))
	case !exp.After(now):
		return nil, rejectf(rejectStale, "expired at %s", exp.UTC().Format(time.RFC3339))
	case exp.Sub(iat) > maxMessageTTL:
		return nil, rejectf(rejectStale, "lifetime %s exceeds %s", exp.Sub(iat), maxMessageTTL)
	}
	return &m, nil
}

// Subjects. Every federation subject is
//
//	beam.fed.<target>.<origin>.<kind>
//
// where <target> and <origin> are subject tokens of directory domains
// (dots replaced by underscores).

// subjectPrefix starts every federation subject.
const subjectPrefix = "beam.fed"

// Token is the subject token of a domain: its dots replaced by
// underscores. It is injective on valid domains (org labels have no dots).
func Token(domain string) string { return strings.ReplaceAll(domain, ".", "_") }

// Subject is the subject origin publishes kind messages for target on.
func Subject(target, origin, kind string) string {
	return subjectPrefix + "." + Token(target) + "." + Token(origin) + "." + kind
}

// InboxPrefix is the reply inbox prefix of a directory: it may subscribe
// only below it.
func InboxPrefix(domain string) string { return "_INBOX_" + Token(domain) }

// parseSubject splits a subject into target token, origin token and kind.
func parseSubject(s string) (target, origin, kind string, err error) {
	rest, ok := strings.CutPrefix(s, subjectPrefix+".")
	if !ok {
		return "", "", "", errors.New("not a federation subject")
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("subject %q: want %s.<target>.<origin>.<kind>", truncate(s), subjectPrefix)
	}
	return parts[0], parts[1], parts[2], nil
}
