package directory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"reflect"
	"sort"
	"unicode/utf8"

	"github.com/beamdir/beam/agents/wire"
)

// Bounds of an intent catalog.
const (
	// maxCatalogBytes bounds a catalog file.
	maxCatalogBytes = 1 << 20
	// maxCatalogIntents bounds the intents of a catalog.
	maxCatalogIntents = 1024
	// maxCatalogFields bounds the payload fields of one intent.
	maxCatalogFields = 256
	// maxCatalogEnum bounds the values of one enum.
	maxCatalogEnum = 256
	maxCatalogID   = 128
)

// Field types of a catalog payload rule.
var catalogTypes = map[string]bool{
	"string": true, "number": true, "integer": true, "boolean": true, "object": true, "array": true,
}

// Catalog is an operator's intent catalog: the intent types the directory
// relays and the rules their payloads must follow. With a catalog loaded an
// intent of a type it does not list is refused (400 INVALID_INTENT
// "Unknown intent type: X"), as is a payload that breaks a rule; without
// one (Config.Catalog nil) any intent type is accepted. It is immutable
// once loaded and safe for concurrent use.
//
// The file is JSON:
//
//	{"intents": [
//	  {"id": "conversation.message", "description": "…",
//	   "payload": {"message": {"type": "string", "required": true, "maxLength": 4000}}},
//	  {"id": "agent.ping"}
//	]}
//
// A field rule has type (string, number, integer, boolean, object, array),
// enum (the allowed JSON values), required (present and not null) and
// maxLength (characters of a string, elements of an array); all optional.
// A null field counts as absent. Fields the catalog does not name are
// allowed. Unknown keys in the file are errors, so that a typo cannot
// silently disable a rule.
type Catalog struct {
	intents map[string]*catalogIntent
	order   []string
	raw     []byte // served by GET /intents/catalog
}

// catalogIntent is one intent type of a catalog.
type catalogIntent struct {
	// ID is the intent type, e.g. "conversation.message".
	ID string `json:"id"`
	// Description says what the intent is for.
	Description string `json:"description,omitempty"`
	// Payload holds the rules of the payload's fields by name.
	Payload map[string]*fieldRule `json:"payload,omitempty"`
}

// fieldRule is the rule of one payload field.
type fieldRule struct {
	// Type is the JSON type the value must have; "" allows any.
	Type string `json:"type,omitempty"`
	// Enum lists the allowed values; empty allows any.
	Enum []any `json:"enum,omitempty"`
	// Required demands the field be present and not null.
	Required bool `json:"required,omitempty"`
	// MaxLength bounds a string's length in characters (Unicode code points)
	// or an array's number of elements; 0 means no bound.
	MaxLength int `json:"maxLength,omitempty"`
	// Description says what the field means.
	Description string `json:"description,omitempty"`
}

// loadCatalog reads and checks the catalog file at path.
func loadCatalog(path string) (*Catalog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load intent catalog: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCatalogBytes+1))
	if err != nil {
		return nil, fmt.Errorf("load intent catalog %s: %w", path, err)
	}
	c, err := ParseCatalog(data)
	if err != nil {
		return nil, fmt.Errorf("load intent catalog %s: %w", path, err)
	}
	return c, nil
}

// ParseCatalog checks and returns the catalog in data (the file format of
// loadCatalog).
func ParseCatalog(data []byte) (*Catalog, error) {
	if len(data) > maxCatalogBytes {
		return nil, fmt.Errorf("catalog is larger than %d bytes", maxCatalogBytes)
	}
	var doc struct {
		Intents []*catalogIntent `json:"intents"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("catalog is not valid: %w", err)
	}
	if dec.More() {
		return nil, errors.New("catalog is not valid: data after the JSON object")
	}
	if doc.Intents == nil {
		return nil, errors.New(`catalog is not valid: missing "intents" array`)
	}
	if len(doc.Intents) > maxCatalogIntents {
		return nil, fmt.Errorf("catalog has %d intents, limit %d", len(doc.Intents), maxCatalogIntents)
	}
	c := &Catalog{intents: make(map[string]*catalogIntent, len(doc.Intents))}
	for i, in := range doc.Intents {
		if in == nil || in.ID == "" {
			return nil, fmt.Errorf("catalog intent #%d: missing id", i+1)
		}
		if len(in.ID) > maxCatalogID || !utf8.ValidString(in.ID) {
			return nil, fmt.Errorf("catalog intent #%d: id must be valid UTF-8 of at most %d bytes", i+1, maxCatalogID)
		}
		if _, dup := c.intents[in.ID]; dup {
			return nil, fmt.Errorf("catalog intent %q is listed twice", in.ID)
		}
		if len(in.Payload) > maxCatalogFields {
			return nil, fmt.Errorf("catalog intent %q has %d fields, limit %d", in.ID, len(in.Payload), maxCatalogFields)
		}
		for name, r := range in.Payload {
			if err := r.check(); err != nil {
				return nil, fmt.Errorf("catalog intent %q field %q: %w", in.ID, name, err)
			}
		}
		c.intents[in.ID] = in
		c.order = append(c.order, in.ID)
	}
	raw, err := json.Marshal(struct {
		Mode    string           `json:"mode"`
		Intents []*catalogIntent `json:"intents"`
	}{"catalog", doc.Intents})
	if err != nil {
		return nil, fmt.Errorf("encode catalog: %w", err)
	}
	c.raw = raw
	return c, nil
}

func (r *fieldRule) check() error {
	if r == nil {
		return errors.New("rule must be an object")
	}
	if r.Type != "" && !catalogTypes[r.Type] {
		return fmt.Errorf("unknown type %q (want string, number, integer, boolean, object or array)", r.Type)
	}
	if r.MaxLength < 0 {
		return errors.New("maxLength must not be negative")
	}
	if r.MaxLength > 0 && r.Type != "" && r.Type != "string" && r.Type != "array" {
		return fmt.Errorf("maxLength applies to strings and arrays, not %s", r.Type)
	}
	if len(r.Enum) > maxCatalogEnum {
		return fmt.Errorf("enum has %d values, limit %d", len(r.Enum), maxCatalogEnum)
	}
	for _, v := range r.Enum {
		if r.Type != "" && jsonType(v) != r.Type && !(r.Type == "integer" && jsonType(v) == "number" && isIntegral(v)) {
			return fmt.Errorf("enum value %v is not of type %s", v, r.Type)
		}
	}
	return nil
}

// Intents returns the catalog's intent types in file order.
func (c *Catalog) Intents() []string {
	return append([]string(nil), c.order...)
}

// Validate checks an intent type and its payload (a JSON object) against
// the catalog. The error names the offending field. A nil catalog accepts
// everything.
func (c *Catalog) Validate(intent string, payload json.RawMessage) error {
	if c == nil {
		return nil
	}
	in, ok := c.intents[intent]
	if !ok {
		//lint:ignore ST1005 the reference's wording, which clients match
		return fmt.Errorf("Unknown intent type: %s", intent)
	}
	if len(in.Payload) == 0 {
		return nil
	}
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil || fields == nil {
		//lint:ignore ST1005 the reference's wording, which clients match
		return fmt.Errorf("Invalid payload for intent %s: payload must be a JSON object", intent)
	}
	names := make([]string, 0, len(in.Payload))
	for name := range in.Payload {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := in.Payload[name].validate(fields[name]); err != nil {
			//lint:ignore ST1005 the reference's wording, which clients match
			return fmt.Errorf("Invalid payload for intent %s: field %q %v", intent, name, err)
		}
	}
	return nil
}

func (r *fieldRule) validate(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		if r.Required {
			return errors.New("is required")
		}
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("is not valid JSON: %w", err)
	}
	switch t := jsonType(v); {
	case r.Type == "" || r.Type == t:
	case r.Type == "integer" && t == "number" && isIntegral(v):
	default:
		return fmt.Errorf("must be of type %s, got %s", r.Type, t)
	}
	if r.MaxLength > 0 {
		switch x := v.(type) {
		case string:
			if n := utf8.RuneCountInString(x); n > r.MaxLength {
				return fmt.Errorf("is %d characters long, maxLength %d", n, r.MaxLength)
			}
		case []any:
			if len(x) > r.MaxLength {
				return fmt.Errorf("has %d elements, maxLength %d", len(x), r.MaxLength)
			}
		}
	}
	if len(r.Enum) > 0 {
		for _, e := range r.Enum {
			if reflect.DeepEqual(e, v) {
				return nil
			}
		}
		allowed, _ := json.Marshal(r.Enum)
		return fmt.Errorf("must be one of %s", allowed)
	}
	return nil
}

// jsonType names the JSON type of a value decoded by encoding/json.
func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "boolean"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case nil:
		return "null"
	}
	return "unknown"
}

func isIntegral(v any) bool {
	f, ok := v.(float64)
	return ok && !math.IsInf(f, 0) && f == math.Trunc(f)
}

// checkCatalog applies Config.Catalog to an authentic frame (after policy,
// before the timestamp window).
func (d *Directory) checkCatalog(f *wire.IntentFrame) (code, msg string) {
	if err := d.cfg.Catalog.Validate(f.Intent, f.Payload); err != nil {
		return CodeInvalidIntent, err.Error()
	}
	return "", ""
}

// openCatalog is GET /intents/catalog without a catalog.
var openCatalog = []byte(`{"mode":"open","intents":[]}`)

// handleCatalog serves GET /intents/catalog: {"mode":"catalog","intents":
// […]} with the loaded catalog, {"mode":"open","intents":[]} without one.
func (d *Directory) handleCatalog(w http.ResponseWriter, _ *http.Request) {
	body := openCatalog
	if d.cfg.Catalog != nil {
		body = d.cfg.Catalog.raw
	}
	writeRaw(w, http.StatusOK, body)
}
