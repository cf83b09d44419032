package mesh

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/jsonschema-go/jsonschema"

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

	schema *jsonschema.Resolved
}

// CheckInput validates a first payload against the pipeline's input
// schema.
func (p *Pipeline) CheckInput(payload json.RawMessage) error {
	if p.schema == nil {
		return nil
	}
	var v any
	if err := json.Unmarshal(payload, &v); err != nil {
		return fmt.Errorf("the input is not JSON: %w", err)
	}
	if err := p.schema.Validate(v); err != nil {
		return fmt.Errorf("the input does not match the input schema of %s: %w", p.Name, err)
	}
	return nil
}

// maxPipelines bounds the pipelines of one file.
const maxPipelines = 1000

// pipelineName is what a pipeline name may be: usable in a URL path
// segment and as an MCP tool name.
var pipelineName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ParsePipelines reads a pipelines file,
//
//	{"pipelines":[{"name":"enrich","description":"…","inputSchema":{…},"route":["prep@acme.beam.directory",…]}]}
//
// and checks every pipeline: a name of letters, digits, '.', '_' and '-'
// (at most 64, unique), a route of 1 to defaultMaxHops Beam IDs (x-sink and
// x-sump are reserved), an input schema (draft 2020-12 or draft-07, no
// remote references) of type "object". Unknown fields are errors.
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
	if len(f.Pipelines) > maxPipelines {
		return nil, fmt.Errorf("pipelines file: %d pipelines, at most %d", len(f.Pipelines), maxPipelines)
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
		if _, err := wire.NewMeshRoute(p.Route, defaultMaxHops); err != nil {
			return nil, fmt.Errorf("pipeline %q: route: %w", p.Name, err)
		}
		for _, a := range p.Route {
			if _, err := wire.ParseBeamID(a); err != nil {
				return nil, fmt.Errorf("pipeline %q: route actor %q is not a Beam ID: %w", p.Name, a, err)
			}
		}
		if len(bytes.TrimSpace(p.InputSchema)) == 0 {
			f.Pipelines[i].InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		rs, err := resolveInputSchema(f.Pipelines[i].InputSchema)
		if err != nil {
			return nil, fmt.Errorf("pipeline %q: inputSchema: %w", p.Name, err)
		}
		f.Pipelines[i].schema = rs
	}
	return f.Pipelines, nil
}

// resolveInputSchema accepts a JSON Schema object of type "object" (MCP
// tools take object arguments; the payload is a JSON object).
func resolveInputSchema(raw json.RawMessage) (*jsonschema.Resolved, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, errors.New("must be a JSON Schema object")
	}
	var ts string
	if json.Unmarshal(m["type"], &ts) != nil || ts != "object" {
		return nil, errors.New(`type must be "object": the payload is a JSON object`)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("not a JSON Schema: %w", err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		return nil, fmt.Errorf("not a usable JSON Schema: %w", err)
	}
	return rs, nil
}
