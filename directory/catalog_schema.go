package directory

import (
	"encoding/json"
	"slices"
)

// Schema returns the JSON Schema of intent's payload as the catalog's
// field rules describe it (an object schema: types, enums, lengths,
// required fields), and whether the catalog has the intent. A nil catalog
// has none.
func (c *Catalog) Schema(intent string) (json.RawMessage, bool) {
	if c == nil {
		return nil, false
	}
	in, ok := c.intents[intent]
	if !ok {
		return nil, false
	}
	props := map[string]any{}
	required := []string{}
	for name, r := range in.Payload {
		p := map[string]any{}
		if r.Type != "" {
			p["type"] = r.Type
		}
		if len(r.Enum) > 0 {
			p["enum"] = r.Enum
		}
		if r.MaxLength > 0 {
			switch r.Type {
			case "array":
				p["maxItems"] = r.MaxLength
			default:
				p["maxLength"] = r.MaxLength
			}
		}
		if r.Description != "" {
			p["description"] = r.Description
		}
		props[name] = p
		if r.Required {
			required = append(required, name)
		}
	}
	slices.Sort(required)
	s := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		s["required"] = required
	}
	if in.Description != "" {
		s["description"] = in.Description
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, false
	}
	return b, true
}
