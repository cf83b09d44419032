package registry

import (
	"net/http"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
)

// apiHandler is a route handler that returns its failure instead of writing
// it. It must not have written a response when it returns an error.
type apiHandler func(w http.ResponseWriter, req *http.Request) error

// serve adapts h to an http.HandlerFunc that writes a returned error in the
// Beam error shape (httpjson.Adapter).
func (r *Registry) serve(h apiHandler) http.HandlerFunc {
	return httpjson.Adapter{Log: r.lg}.Handler(func(w http.ResponseWriter, req *http.Request) error {
		if r.replicator() != nil && req.Method != http.MethodGet {
			return r.serveReplicated(h, w, req)
		}
		return h(w, req)
	})
}

// lookup returns the agent with the (already normalized) Beam ID, or
// 404 NOT_FOUND.
func (r *Registry) lookup(beamID string) (Agent, error) {
	a, ok := r.Get(beamID)
	if !ok {
		return Agent{}, httpjson.Errorf(http.StatusNotFound, "NOT_FOUND", "agent %s not found", beamID)
	}
	return a, nil
}

// denyCaller is the error for a caller that may not do what it asked:
// 403 FORBIDDEN naming its role when it is an operator ("operator role %q
// may not " + what), 401 UNAUTHORIZED with anonymous otherwise.
func denyCaller(c caller, what, anonymous string) error {
	if c.operator != "" {
		return httpjson.Errorf(http.StatusForbidden, "FORBIDDEN", "operator role %q may not %s", c.operator, what)
	}
	return httpjson.Errorf(http.StatusUnauthorized, "UNAUTHORIZED", "%s", anonymous)
}

// mutationTarget identifies the caller of a change to agent beamID and
// loads the agent. The caller must be the agent itself (API key) or a
// mutating operator, or offer a signature (signed) that the route checks
// later; otherwise the error is denyCaller(c, what, anonymous). A missing
// agent is 404 NOT_FOUND, checked after the caller.
func (r *Registry) mutationTarget(req *http.Request, beamID string, signed bool, what, anonymous string) (Agent, caller, error) {
	c, err := r.identify(req, beamID)
	if err != nil {
		return Agent{}, c, err
	}
	if !c.owner && !canMutate(c.operator) && !signed {
		return Agent{}, c, denyCaller(c, what, anonymous)
	}
	a, err := r.lookup(beamID)
	return a, c, err
}

// agentRoute describes one signed change to the agent named by the
// {beamId} path value (see changeAgent).
type agentRoute struct {
	// parse reads and validates the route's own body fields once the agent
	// is loaded, and returns the object its signature covers (without
	// timestamp and nonce).
	parse func(f fields, a *Agent) (map[string]any, error)
	// allowOperator lets a mutating operator role act for the agent.
	allowOperator bool
	// apply checks the change against the authorized agent and makes it on
	// next, a copy of that agent whose slices must be copied before they
	// are modified.
	apply func(next *Agent, now time.Time) (agentChange, error)
}

// agentChange is what agentRoute.apply made.
type agentChange struct {
	action  string         // the audit row's action
	details map[string]any // the audit row's details
	keys    bool           // the key history changed: rewrite agent_keys too
	noWrite bool           // nothing changed: record only the nonce and audit row
	// reply, when set, makes the response these fields plus beamId, agent
	// (the full view) and keyState; otherwise it is the full view.
	reply map[string]any
}

// changeAgent runs one signed change to the agent named by {beamId}: read
// the body, take the write lock, load the agent, parse the route's fields
// and the signature fields, authorize, apply, commit the rows with the
// nonce and one audit row, update the cache and answer 200 with the
// agent's full view.
func (r *Registry) changeAgent(w http.ResponseWriter, req *http.Request, rt agentRoute) error {
	f, err := readObject(w, req)
	if err != nil {
		return err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	a, err := r.agentFromPath(req, "beamId")
	if err != nil {
		return err
	}
	obj, err := rt.parse(f, &a)
	if err != nil {
		return err
	}
	p, err := f.signed()
	if err != nil {
		return err
	}
	now := r.now()
	az, err := r.authorize(req, &a, p, obj, rt.allowOperator, now)
	if err != nil {
		return err
	}
	next := a
	ch, err := rt.apply(&next, now)
	if err != nil {
		return err
	}
	o := &op{Kind: ch.action, Target: a.BeamID, Details: ch.details, Keys: ch.keys}
	if !ch.noWrite {
		o.Agent = stateOf(&next, now)
	}
	if err := r.commit(req.Context(), az, now, o); err != nil {
		return err
	}
	r.setAgent(next.BeamID, &next)
	if ch.reply == nil {
		httpjson.Write(w, http.StatusOK, fullViewOf(&next, now))
		return nil
	}
	ch.reply["beamId"] = next.BeamID
	ch.reply["agent"] = fullViewOf(&next, now)
	ch.reply["keyState"] = keyStateOf(&next)
	httpjson.Write(w, http.StatusOK, ch.reply)
	return nil
}
