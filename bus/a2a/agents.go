package a2a

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Capability is the capability an agent registers with to be an A2A agent
// of the directory (/a2a/agents/{beamId}); its other capabilities are its
// skills, the intent types a message to it may become.
const Capability = "a2a"

// Intents sends intents as an agent and reads them back: the message
// bus's API-key send path (bus.Bus).
type Intents interface {
	SendAs(ctx context.Context, from, to, intent string, payload json.RawMessage) (string, error)
	Message(ctx context.Context, nonce string) (tracing.MessageRow, bool, error)
	Await(ctx context.Context, nonce string, max time.Duration) (tracing.MessageRow, error)
}

// agentWait bounds how long a blocking send to an agent waits before it
// answers the task as it stands.
const agentWait = 60 * time.Second

// optedIn returns the agent {beamId} names if it opted in.
func (s *Server) optedIn(r *http.Request) (registry.Agent, bool) {
	if s.cfg.Intents == nil {
		return registry.Agent{}, false
	}
	a, ok := s.cfg.Registry.Get(r.PathValue("beamId"))
	if !ok || !slices.Contains(a.Capabilities, Capability) {
		return registry.Agent{}, false
	}
	return a, true
}

func skillsOf(a registry.Agent) []string {
	var out []string
	for _, c := range a.Capabilities {
		if c != Capability {
			out = append(out, c)
		}
	}
	return out
}

func (s *Server) handleAgentCard(w http.ResponseWriter, r *http.Request) error {
	a, ok := s.optedIn(r)
	if !ok {
		return httpjson.NotFound("NOT_FOUND", "no agent "+r.PathValue("beamId")+" offers A2A here")
	}
	var skills []skill
	for _, c := range skillsOf(a) {
		skills = append(skills, skill{ID: c, Name: c, Description: "the intent " + c + " to " + a.BeamID + " (name it in the message metadata as \"intent\")",
			Tags: []string{"intent"}, InputModes: modes, OutputModes: []string{"application/json"}})
	}
	name := a.DisplayName
	if name == "" {
		name = a.BeamID
	}
	desc := a.Description
	if desc == "" {
		desc = "The agent " + a.BeamID
	}
	card := s.card(r, "/a2a/agents/"+a.BeamID, name, desc, skills)
	card.Capabilities["streaming"] = false
	card.Capabilities["pushNotifications"] = false
	card.SupportedInterfaces = slices.DeleteFunc(card.SupportedInterfaces, func(i agentInterface) bool { return i.ProtocolBinding != "JSONRPC" })
	httpjson.Write(w, http.StatusOK, card)
	return nil
}

// handleAgentRPC is the JSON-RPC binding of an opted-in agent: a message
// becomes an intent from the caller, sent as a bus API-key send; the task
// is that message.
func (s *Server) handleAgentRPC(w http.ResponseWriter, r *http.Request) error {
	a, ok := s.optedIn(r)
	if !ok {
		return httpjson.NotFound("NOT_FOUND", "no agent "+r.PathValue("beamId")+" offers A2A here")
	}
	c, ok := s.readRPC(w, r)
	if !ok {
		return nil
	}
	ctx := r.Context()
	switch c.op {
	case "send":
		var p sendParams
		if err := json.Unmarshal(c.params, &p); err != nil || p.Message == nil {
			writeRPC(w, c.req.ID, nil, errInvalidParams("params.message is required"))
			return nil
		}
		if p.Message.TaskID != "" {
			writeRPC(w, c.req.ID, nil, errUnsupported("an intent is answered once: send a new message"))
			return nil
		}
		intent, aerr := intentOf(a, &p)
		if aerr != nil {
			writeRPC(w, c.req.ID, nil, aerr)
			return nil
		}
		payload, err := payloadOf(p.Message)
		if err != nil {
			writeRPC(w, c.req.ID, nil, s.asError(err))
			return nil
		}
		nonce, err := s.cfg.Intents.SendAs(ctx, c.caller, a.BeamID, intent, payload)
		var se *bus.SendError
		if errors.As(err, &se) {
			e := errInvalidParams(se.Msg)
			e.Reason = se.Code
			writeRPC(w, c.req.ID, nil, e)
			return nil
		}
		if err != nil {
			writeRPC(w, c.req.ID, nil, s.asError(err))
			return nil
		}
		wait := agentWait
		if p.immediate() {
			wait = 0
		} else {
			longLived(w)
		}
		row, err := s.cfg.Intents.Await(ctx, nonce, wait)
		if err != nil {
			if !ctxErr(err) {
				writeRPC(w, c.req.ID, nil, s.asError(err))
			}
			return nil
		}
		c.result(w, intentTask(c.v, row))
	case "get", "cancel":
		var p struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(c.params, &p); err != nil || p.ID == "" {
			writeRPC(w, c.req.ID, nil, errInvalidParams("params.id (the task id) is required"))
			return nil
		}
		row, ok, err := s.cfg.Intents.Message(ctx, p.ID)
		if err != nil {
			writeRPC(w, c.req.ID, nil, s.asError(err))
			return nil
		}
		if !ok || row.Sender != c.caller || row.Recipient != a.BeamID {
			writeRPC(w, c.req.ID, nil, errTaskNotFound(p.ID))
			return nil
		}
		if c.op == "cancel" {
			writeRPC(w, c.req.ID, nil, &a2aError{Code: -32002, Msg: "an intent already sent cannot be canceled"})
			return nil
		}
		c.result(w, intentTask(c.v, row))
	case "push":
		writeRPC(w, c.req.ID, nil, errPushUnsupported())
	default:
		writeRPC(w, c.req.ID, nil, errUnsupported(c.req.Method+" is not offered by an agent's endpoint (no streaming, no listing)"))
	}
	return nil
}

// intentOf is the intent type a message to a becomes: metadata.intent
// when it is one of a's skills, else a's only skill.
func intentOf(a registry.Agent, p *sendParams) (string, *a2aError) {
	skills := skillsOf(a)
	var meta struct {
		Intent string `json:"intent"`
	}
	for _, raw := range []json.RawMessage{p.Message.Metadata, p.Metadata} {
		if len(raw) > 0 && meta.Intent == "" {
			_ = json.Unmarshal(raw, &meta)
		}
	}
	switch {
	case meta.Intent != "" && slices.Contains(skills, meta.Intent):
		return meta.Intent, nil
	case meta.Intent != "":
		return "", errInvalidParams("intent " + meta.Intent + " is not a skill of " + a.BeamID)
	case len(skills) == 1:
		return skills[0], nil
	default:
		return "", errInvalidParams("name the intent (one of the card's skills) in the message metadata as \"intent\"")
	}
}

// intentTask is the task a sent intent is: queued → submitted, on its way
// → working, answered → completed with the result as artifact, failed or
// dead-lettered → failed.
func intentTask(v version, row tracing.MessageRow) task {
	st := tracing.MeshPending
	switch row.Status {
	case tracing.Dispatched, tracing.Delivered:
		st = tracing.MeshRunning
	case tracing.Acked:
		st = tracing.MeshSucceeded
	case tracing.Failed, tracing.DeadLetter:
		st = tracing.MeshFailed
	}
	t := task{Kind: v.kind("task"), ID: row.Nonce, ContextID: row.Nonce,
		Status:   taskStatus{State: v.state(st), Timestamp: time.Unix(0, int64(row.UpdatedAt*1e9)).UTC().Format(time.RFC3339Nano)},
		Metadata: map[string]any{"beam": map[string]any{"messageId": row.ID, "intent": row.Intent, "to": row.Recipient, "messageStatus": string(row.Status)}}}
	switch st {
	case tracing.MeshSucceeded:
		if len(row.Response) > 0 {
			t.Artifacts = []artifact{{ArtifactID: resultArtifact, Name: "result", Description: "the agent's result", Parts: []part{dataPart(v, json.RawMessage(row.Response))}}}
		}
	case tracing.MeshFailed:
		if row.Error != "" {
			t.Status.Message = &message{Kind: v.kind("message"), MessageID: row.Nonce + "-status", ContextID: row.Nonce, TaskID: row.Nonce,
				Role: v.role(true), Parts: []part{textPart(v, row.Error)}}
		}
	}
	return t
}
