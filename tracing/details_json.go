package tracing

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// detailsKeys are the JSON keys of the known Details fields. Extra keys that
// match one of them (ignoring case, as encoding/json does) are never written
// and never read into Extra: the known fields always win.
var detailsKeys = []string{
	"owner", "frame", "clientTimestamp", "timeoutMs", "errorCode", "error",
	"retryable", "latencyMs", "result", "bus", "nextRetryAt", "retryCount",
	"leaseOwner", "leaseExpiresAt", "response", "legacyStage", "legacyStatus", "job", "mesh",
}

func isDetailsKey(k string) bool {
	for _, known := range detailsKeys {
		if strings.EqualFold(k, known) {
			return true
		}
	}
	return false
}

// MarshalJSON encodes the details as one flat JSON object: the known fields
// under their keys (empty ones omitted) as encoding/json writes them with
// HTML escaping off (raw values compacted), then the Extra keys in sorted
// order. Extra never overrides a known key. Strings must be valid UTF-8.
func (d Details) MarshalJSON() ([]byte, error) {
	return d.appendJSON(make([]byte, 0, 128))
}

// appendJSON appends the encoded details (MarshalJSON) to b.
func (d *Details) appendJSON(b []byte) ([]byte, error) {
	if err := d.checkUTF8(); err != nil {
		return nil, err
	}
	type plain Details // same fields, no methods
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode((*plain)(d)); err != nil {
		return nil, fmt.Errorf("encode details: %w", err)
	}
	known := bytes.TrimSuffix(buf.Bytes(), []byte("}\n"))
	b = append(b, known...)
	keys := make([]string, 0, len(d.Extra))
	for k := range d.Extra {
		if !isDetailsKey(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for i, k := range keys {
		v, err := json.Marshal(d.Extra[k])
		if err != nil {
			return nil, fmt.Errorf("encode details key %q: %w", k, err)
		}
		if i > 0 || len(known) > 1 {
			b = append(b, ',')
		}
		kb, _ := json.Marshal(k) // a valid UTF-8 string always encodes
		b = append(append(append(b, kb...), ':'), v...)
	}
	return append(b, '}'), nil
}

// checkUTF8 refuses strings that are not valid UTF-8 (encoding/json would
// replace their bad bytes, so the log would not keep what it was given).
func (d *Details) checkUTF8() error {
	list := []string{string(d.Owner), d.ClientTimestamp, d.ErrorCode, d.Error, d.LeaseOwner, d.LegacyStage, d.LegacyStatus}
	if d.Bus != nil {
		list = append(list, d.Bus.MessageID, d.Bus.TraceID)
	}
	for k := range d.Extra {
		list = append(list, k)
	}
	for _, v := range list {
		if !utf8.ValidString(v) {
			return errors.New("details: string is not valid UTF-8")
		}
	}
	return nil
}

// UnmarshalJSON decodes a flat JSON object: known keys into their fields,
// every other key into Extra (numbers as json.Number, so they round-trip
// exactly).
func (d *Details) UnmarshalJSON(b []byte) error {
	if err := d.decodeKnown(b); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return fmt.Errorf("decode details: %w", err)
	}
	for k, raw := range all {
		if isDetailsKey(k) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("decode details key %q: %w", k, err)
		}
		if d.Extra == nil {
			d.Extra = make(map[string]any)
		}
		d.Extra[k] = v
	}
	return nil
}

// decodeKnown decodes only the known fields (what the projections read);
// Extra is left nil. "{}" and "" take a fast path.
func (d *Details) decodeKnown(b []byte) error {
	type plain Details // same fields, no methods
	*d = Details{}
	if len(b) == 0 || string(b) == "{}" {
		return nil
	}
	if err := json.Unmarshal(b, (*plain)(d)); err != nil {
		return fmt.Errorf("decode details: %w", err)
	}
	return nil
}

// normalize puts the details in the form they take after a round trip
// through the log, so that the incremental fold (which sees the caller's
// value) and Rebuild (which sees the decoded value) read the same thing: raw
// JSON fields are validated and compacted, and empty or null raws become nil.
// Strings are checked by the encoder (invalid UTF-8 is an error).
func (d *Details) normalize() error {
	var err error
	if d.Frame, err = normRaw("frame", d.Frame); err != nil {
		return err
	}
	if d.Result, err = normRaw("result", d.Result); err != nil {
		return err
	}
	if d.Response, err = normRaw("response", d.Response); err != nil {
		return err
	}
	if d.Mesh, err = normRaw("mesh", d.Mesh); err != nil {
		return err
	}
	if d.Bus != nil {
		b := *d.Bus
		if b.Payload, err = normRaw("bus.payload", b.Payload); err != nil {
			return err
		}
		if b.Metadata, err = normRaw("bus.metadata", b.Metadata); err != nil {
			return err
		}
		d.Bus = &b
	}
	if d.Job != nil {
		j := *d.Job
		if j.Payload, err = normRaw("job.payload", j.Payload); err != nil {
			return err
		}
		if j.Result, err = normRaw("job.result", j.Result); err != nil {
			return err
		}
		d.Job = &j
	}
	return nil
}

// normRaw validates and compacts a raw value, as the encoder writes it;
// empty and null become nil.
func normRaw(name string, r json.RawMessage) (json.RawMessage, error) {
	if len(r) == 0 {
		return nil, nil
	}
	t := bytes.TrimSpace(r)
	if len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	if !bytes.ContainsAny(t, " \t\r\n") {
		// Already compact (whitespace inside strings would only cost a
		// compaction that changes nothing).
		if !json.Valid(t) {
			return nil, fmt.Errorf("details %s: not valid JSON", name)
		}
		return t, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, t); err != nil {
		return nil, fmt.Errorf("details %s: not valid JSON", name)
	}
	return b.Bytes(), nil
}

// RawJSON is a JSON value kept in a TEXT column of a projection. A nil
// RawJSON is SQL NULL and encodes as JSON null.
type RawJSON []byte

// Scan implements sql.Scanner.
func (r *RawJSON) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*r = nil
	case string:
		*r = RawJSON(v)
	case []byte:
		*r = RawJSON(bytes.Clone(v))
	default:
		return fmt.Errorf("scan RawJSON: unsupported type %T", src)
	}
	return nil
}

// Value implements driver.Valuer: nil is NULL, anything else TEXT.
func (r RawJSON) Value() (driver.Value, error) {
	if r == nil {
		return nil, nil
	}
	return string(r), nil
}

// MarshalJSON writes the value verbatim, or null.
func (r RawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

// UnmarshalJSON keeps a copy of the raw value; null becomes nil.
func (r *RawJSON) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*r = nil
		return nil
	}
	*r = RawJSON(bytes.Clone(b))
	return nil
}
