package mesh

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/beamdir/beam/agents/wire"
)

// Pipeline is a pipeline an operator declared by name (beam serve
// --pipelines): a fixed route of actors, offered to A2A clients as an
// agent and to MCP hosts as a tool.
type Pipeline struct {
	// Name identifies the pipeline in URLs and as the MCP tool name.
	Name string `json:"name"`
	// Description tells clients what the pipeline does.
	Description string `json:"description,omitempty"`
	// InputSchema is the JSON Schema of the envelope's first payload (an
	// object schema); empty means any JSON object.
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
	// Route is the actors' Beam IDs in order.
	Route []string `json:"route"`
}

// MaxPipelines bounds the pipelines of one file.
const MaxPipelines = 1000

// pipelineName is what a pipeline name may be: usable in a URL path
// segment and as an MCP tool name.
var pipelineName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ParsePipelines reads a pipelines file,
//
//	{"pipelines":[{"name":"enrich","description":"…","inputSchema":{…},"route":["prep@acme.beam.directory",…]}]}
//
// and checks every pipeline: a name of letters, digits, '.', '_' and '-'
// (at most 64, unique), a route of 1 to DefaultMaxHops Beam IDs (x-sink and
// x-sump are reserved), an input schema that is a JSON object whose type,
// when given, is "object". Unknown fields are errors.
func ParsePipelines(b []byte) ([]Pipeline, error) {
	var f struct {
		Pipelines []Pipeline `json:"pipelines"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("pipelines file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("pipelines file: trailing data after the JSON object")
	}
	if len(f.Pipelines) > MaxPipelines {
		return nil, fmt.Errorf("pipelines file: %d pipelines, at most %d", len(f.Pipelines), MaxPipelines)
	}
	seen := map[string]bool{}
	for i, p := range f.Pipelines {
		if !pipelineName.MatchString(p.Name) {
			return nil, fmt.Errorf("pipeline %d: name %q: want 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", i, p.Name)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("pipeline %q: declared twice", p.Name)
		}
		seen[p.Name] = true
		if _, err := NewRoute(p.Route, DefaultMaxHops); err != nil {
			return nil, fmt.Errorf("pipeline %q: route: %w", p.Name, err)
		}
		for _, a := range p.Route {
			if _, err := wire.ParseBeamID(a); err != nil {
				return nil, fmt.Errorf("pipeline %q: route actor %q is not a Beam ID: %w", p.Name, a, err)
			}
		}
		if err := checkInputSchema(p.InputSchema); err != nil {
			return nil, fmt.Errorf("pipeline %q: inputSchema: %w", p.Name, err)
		}
		if len(p.InputSchema) == 0 {
			f.Pipelines[i].InputSchema = json.RawMessage(`{"type":"object"}`)
		}
	}
	return f.Pipelines, nil
}

// checkInputSchema accepts an absent schema or a JSON object whose "type",
// when present, is "object" (MCP tools take object arguments).
func checkInputSchema(raw json.RawMessage) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	var s map[string]json.RawMessage
	if err := json.Unmarshal(raw, &s); err != nil || s == nil {
		return errors.New("must be a JSON Schema object")
	}
	if t, ok := s["type"]; ok {
		var ts string
		if json.Unmarshal(t, &ts) != nil || ts != "object" {
			return errors.New(`type must be "object": the payload is a JSON object`)
		}
	}
	return nil
}
