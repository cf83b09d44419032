package mesh

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
)

// errUnauthenticated is wrapped by every Caller error.
var errUnauthenticated = errors.New("send an agent's API key as Authorization: Bearer (or the operator token with X-Beam-Id naming the agent)")

// Caller authenticates a request of an agent protocol (A2A, MCP) and
// returns the agent it acts as: an agent's API key (Authorization: Bearer
// or X-Api-Key), or the operator token with X-Beam-Id (wire.HeaderBeamID)
// naming a registered agent. Errors wrap errUnauthenticated.
func (e *Engine) Caller(r *http.Request) (string, error) {
	if e.cfg.OperatorAuth != nil && e.cfg.OperatorAuth(r) {
		id := strings.TrimSpace(r.Header.Get(wire.HeaderBeamID))
		if _, ok := e.reg.Get(id); !ok {
			return "", fmt.Errorf("%w: the operator token acts for the agent named in %s, and %q is not registered", errUnauthenticated, wire.HeaderBeamID, id)
		}
		return id, nil
	}
	key, ok := httpjson.APIKey(r)
	if !ok {
		key, _ = httpjson.Bearer(r)
	}
	if key == "" {
		return "", errUnauthenticated
	}
	a, ok := e.reg.AuthenticateAPIKey(key)
	if !ok {
		return "", fmt.Errorf("%w: the key is not valid", errUnauthenticated)
	}
	return a.BeamID, nil
}

// Unauthorized answers 401 with the bearer scheme the agent protocols'
// cards and metadata name.
func Unauthorized(w http.ResponseWriter, err error) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="beam", error="invalid_token"`)
	httpjson.WriteError(w, http.StatusUnauthorized, codeUnauthorized, err.Error())
}

// MayStart checks that creator may send the first hop of route, by the
// first actor's ACL rules and the directory's default policy, as a direct
// send of the hop's intent would be checked: the agent protocols refuse a
// task up front instead of creating an envelope that its first hop would
// fail. An actor of a peer directory is left to its directory's policies.
func (e *Engine) MayStart(creator string, route []string) error {
	if len(route) == 0 {
		return nil
	}
	if _, local := e.reg.Get(route[0]); !local {
		return nil
	}
	if ok, reason := e.reg.Allowed(creator, route[0], intentEnvelope); !ok {
		msg := fmt.Sprintf("ACL denied intent %s from %s to %s", intentEnvelope, creator, route[0])
		if reason != "" {
			msg += " (" + reason + ")"
		}
		return httpjson.Errorf(http.StatusForbidden, codeForbidden, "%s", msg)
	}
	return nil
}
