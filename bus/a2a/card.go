package a2a

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/internal/httpjson"
)

// Card shapes: protocol 1.0 fields (supportedInterfaces,
// securityRequirements, securitySchemes in the proto JSON form) together
// with the 0.3 fields (url, preferredTransport, protocolVersion, security,
// additionalInterfaces), so that clients of either version read the same
// card. The scheme object carries both forms of the bearer scheme.

type agentInterface struct {
	URL             string `json:"url"`
	ProtocolBinding string `json:"protocolBinding,omitempty"`
	ProtocolVersion string `json:"protocolVersion,omitempty"`
	// Transport is the 0.3 name of the binding (additionalInterfaces).
	Transport string `json:"transport,omitempty"`
}

type skill struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Tags        []string `json:"tags"`
	InputModes  []string `json:"inputModes,omitempty"`
	OutputModes []string `json:"outputModes,omitempty"`
}

type agentCard struct {
	Name                 string           `json:"name"`
	Description          string           `json:"description"`
	Version              string           `json:"version"`
	SupportedInterfaces  []agentInterface `json:"supportedInterfaces"`
	Provider             map[string]any   `json:"provider,omitempty"`
	Capabilities         map[string]any   `json:"capabilities"`
	SecuritySchemes      map[string]any   `json:"securitySchemes"`
	SecurityRequirements []map[string]any `json:"securityRequirements"`
	DefaultInputModes    []string         `json:"defaultInputModes"`
	DefaultOutputModes   []string         `json:"defaultOutputModes"`
	Skills               []skill          `json:"skills"`

	// 0.3 fields.
	URL                  string                `json:"url"`
	PreferredTransport   string                `json:"preferredTransport"`
	ProtocolVersion      string                `json:"protocolVersion"`
	AdditionalInterfaces []agentInterface      `json:"additionalInterfaces"`
	Security             []map[string][]string `json:"security"`
}

var modes = []string{"application/json", "text/plain"}

// maxCardSkills bounds the skills of the directory's card.
const maxCardSkills = 1000

// card is the card of the agent served at path (its JSON-RPC endpoint;
// the HTTP+JSON binding lives under the same path).
func (s *Server) card(r *http.Request, path, name, description string, skills []skill) agentCard {
	url := baseURL(r) + path
	return agentCard{
		Name: name, Description: description, Version: "1.0.0",
		SupportedInterfaces: []agentInterface{
			{URL: url, ProtocolBinding: "JSONRPC", ProtocolVersion: "1.0"},
			{URL: url, ProtocolBinding: "HTTP+JSON", ProtocolVersion: "1.0"},
			{URL: url, ProtocolBinding: "JSONRPC", ProtocolVersion: "0.3"},
		},
		Provider:     map[string]any{"organization": s.cfg.Name, "url": baseURL(r)},
		Capabilities: map[string]any{"streaming": true, "pushNotifications": true},
		SecuritySchemes: map[string]any{scheme: map[string]any{
			"type": "http", "scheme": "bearer", "description": "an agent's API key (bk_…)",
			"httpAuthSecurityScheme": map[string]any{"scheme": "Bearer", "description": "an agent's API key (bk_…)"},
		}},
		SecurityRequirements: []map[string]any{{"schemes": map[string]any{scheme: map[string]any{"list": []string{}}}}},
		DefaultInputModes:    modes, DefaultOutputModes: []string{"application/json"},
		Skills: skills,

		URL: url, PreferredTransport: "JSONRPC", ProtocolVersion: "0.3.0",
		AdditionalInterfaces: []agentInterface{{URL: url, Transport: "JSONRPC"}},
		Security:             []map[string][]string{{scheme: {}}},
	}
}

func pipelineSkill(p *mesh.Pipeline, cardURL string) skill {
	desc := p.Description
	if desc == "" {
		desc = "Runs the pipeline " + p.Name
	}
	if cardURL != "" {
		desc += " (agent card: " + cardURL + ")"
	}
	return skill{ID: p.Name, Name: p.Name, Description: desc, Tags: []string{"pipeline"},
		InputModes: modes, OutputModes: []string{"application/json"}}
}

func (s *Server) handlePipelineCard(w http.ResponseWriter, r *http.Request) error {
	p, ok := s.pipeline(r)
	if !ok {
		return httpjson.NotFound("NOT_FOUND", "no pipeline "+r.PathValue("name"))
	}
	desc := p.Description
	if desc == "" {
		desc = "The pipeline " + p.Name
	}
	httpjson.Write(w, http.StatusOK, s.card(r, "/a2a/pipelines/"+p.Name, p.Name, desc, []skill{pipelineSkill(p, "")}))
	return nil
}

// handleDirectoryCard serves the directory's card: every declared
// pipeline as a skill naming its own card; its endpoint answers task
// requests for any of the caller's tasks.
func (s *Server) handleDirectoryCard(w http.ResponseWriter, r *http.Request) {
	names := make([]string, 0, len(s.pipes))
	for n := range s.pipes {
		names = append(names, n)
	}
	slices.Sort(names)
	skills := make([]skill, 0, len(names))
	for _, n := range names {
		skills = append(skills, pipelineSkill(s.pipes[n], baseURL(r)+"/a2a/pipelines/"+n+"/.well-known/agent-card.json"))
	}
	if s.cfg.Intents != nil {
		for _, id := range s.cfg.Registry.Find("") {
			a, ok := s.cfg.Registry.Get(id)
			if !ok || a.Visibility == "unlisted" || !slices.Contains(a.Capabilities, Capability) {
				continue
			}
			if len(skills) >= maxCardSkills {
				break
			}
			skills = append(skills, skill{ID: a.BeamID, Name: cmp.Or(a.DisplayName, a.BeamID),
				Description: "The agent " + a.BeamID + " (agent card: " + baseURL(r) + "/a2a/agents/" + a.BeamID + "/.well-known/agent-card.json)",
				Tags:        []string{"agent"}, InputModes: modes, OutputModes: []string{"application/json"}})
		}
	}
	httpjson.Write(w, http.StatusOK, s.card(r, "/a2a", s.cfg.Name,
		"The agent directory "+s.cfg.Name+": each skill is a pipeline or an agent with its own agent card; this endpoint gets, lists, cancels and follows the caller's pipeline tasks.", skills))
}
