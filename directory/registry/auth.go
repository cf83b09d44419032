package registry

import (
	"net/http"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// timestampWindow is the accepted clock skew of signed requests.
const timestampWindow = 5 * time.Minute

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(req *http.Request) (string, bool) { return httpjson.Bearer(req) }

// apiKeyFrom returns an agent API key carried by req (x-api-key, or a
// bearer token that starts with bk_).
func apiKeyFrom(req *http.Request) (string, bool) { return httpjson.APIKey(req) }

// operatorRole returns the operator role of req, if any.
func (r *Registry) operatorRole(req *http.Request) (string, bool) {
	if r.cfg.OperatorAuth == nil {
		return "", false
	}
	role, ok := r.cfg.OperatorAuth(req)
	if !ok {
		return "", false
	}
	return role, true
}

// canMutate reports whether an operator role may change registry state.
func canMutate(role string) bool { return role == "operator" || role == "admin" }

// caller is who made a request to a route about one agent.
type caller struct {
	owner    bool   // the agent itself (API key)
	operator string // operator role, "" if none
}

func (c caller) actor(beamID string) string {
	if c.owner {
		return "agent:" + beamID
	}
	if c.operator != "" {
		return "operator:" + c.operator
	}
	return "anonymous"
}

// identify inspects API key and operator credentials for a request about
// beamID. A presented API key that is invalid is 401; one of another agent
// is 403. Absent credentials are not an error (the caller may still offer
// a signature).
func (r *Registry) identify(req *http.Request, beamID string) (caller, error) {
	var c caller
	if key, ok := apiKeyFrom(req); ok {
		a, ok := r.AuthenticateAPIKey(key)
		if !ok {
			return c, httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "invalid API key")
		}
		if a.BeamID != beamID {
			return c, httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "API key belongs to another agent")
		}
		c.owner = true
		return c, nil
	}
	if role, ok := r.operatorRole(req); ok {
		c.operator = role
	}
	return c, nil
}

// verifySigned checks a signed request by agent a: timestamp within the
// window, well-formed nonce, and an Ed25519 signature by a's current key
// over the canonical JSON of obj plus timestamp and nonce. The nonce is
// recorded by the caller, in its write transaction.
func (r *Registry) verifySigned(a *Agent, obj map[string]any, p proof, now time.Time) error {
	if p.signature == "" {
		return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required: API key or signature")
	}
	if err := checkFreshness(p, now); err != nil {
		return err
	}
	obj["timestamp"] = p.timestamp
	obj["nonce"] = p.nonce
	raw, err := marshalCanonical(obj)
	if err != nil {
		return err
	}
	if len(p.signature) > 256 {
		return httpjson.Errorf(http.StatusUnauthorized, "INVALID_SIGNATURE", "signature does not verify")
	}
	if err := wire.VerifyCanonical(raw, p.signature, a.PublicKey); err != nil {
		return httpjson.Errorf(http.StatusUnauthorized, "INVALID_SIGNATURE", "signature does not verify against the agent's current key")
	}
	return nil
}

// checkFreshness validates the timestamp and nonce of a signed request.
func checkFreshness(p proof, now time.Time) error {
	if p.timestamp == "" || len(p.timestamp) > 64 {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_TIMESTAMP", "a signed request needs an ISO 8601 timestamp")
	}
	if !validNonce(p.nonce) {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_NONCE", "a signed request needs a nonce of 1–128 printable ASCII characters")
	}
	ts, err := wire.ParseTimestamp(p.timestamp)
	if err != nil {
		return httpjson.Errorf(http.StatusBadRequest, "INVALID_TIMESTAMP", "timestamp is not an ISO 8601 time")
	}
	if d := now.Sub(ts); d > timestampWindow || d < -timestampWindow {
		return httpjson.Errorf(http.StatusUnauthorized, "STALE_TIMESTAMP", "timestamp is outside the ±5 minute window")
	}
	return nil
}
