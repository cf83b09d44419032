package tracing

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/beamdir/beam/internal/jsonscan"
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
// under their keys (empty ones omitted), then the Extra keys in sorted order.
// Extra never overrides a known key. Raw JSON fields (Frame, Result, Response,
// bus payload and metadata) are written verbatim, so a frame keeps its bytes.
// Strings must be valid UTF-8.
func (d Details) MarshalJSON() ([]byte, error) {
	return d.appendJSON(make([]byte, 0, 128), false)
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
// JSON fields are validated and trimmed, and empty or null raws become nil.
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
		// details.job is encoded with encoding/json, which compacts raw
		// values: compact them here too.
		j := *d.Job
		for _, f := range []struct {
			name string
			v    *json.RawMessage
		}{{"job.payload", &j.Payload}, {"job.result", &j.Result}} {
			if *f.v, err = normRaw(f.name, *f.v); err != nil {
				return err
			}
			if *f.v != nil {
				var b bytes.Buffer
				if err := json.Compact(&b, *f.v); err != nil {
					return fmt.Errorf("details %s: %w", f.name, err)
				}
				*f.v = b.Bytes()
			}
		}
		d.Job = &j
	}
	return nil
}

func normRaw(name string, r json.RawMessage) (json.RawMessage, error) {
	if len(r) == 0 {
		return nil, nil
	}
	t := bytes.TrimSpace(r)
	if len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	if !json.Valid(t) {
		return nil, fmt.Errorf("details %s: not valid JSON", name)
	}
	if len(t) == len(r) {
		return r, nil
	}
	return t, nil
}

type objWriter struct {
	b   []byte
	n   int
	err error
	// trusted skips the validation of raw values (see appendJSON).
	trusted bool
}

func (w *objWriter) key(k string) {
	if w.n > 0 {
		w.b = append(w.b, ',')
	}
	w.n++
	w.b = appendJSONString(w.b, k, &w.err)
	w.b = append(w.b, ':')
}

func (w *objWriter) str(k, v string) {
	if v == "" {
		return
	}
	w.key(k)
	w.b = appendJSONString(w.b, v, &w.err)
}

func (w *objWriter) int(k string, v int64) {
	if v == 0 {
		return
	}
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
}

func (w *objWriter) raw(k string, v json.RawMessage) {
	if len(v) == 0 {
		return
	}
	if w.trusted {
		w.key(k)
		w.b = append(w.b, v...)
		return
	}
	t := bytes.TrimSpace(v)
	if len(t) == 0 {
		return
	}
	if !json.Valid(t) {
		if w.err == nil {
			w.err = fmt.Errorf("details %s: not valid JSON", k)
		}
		return
	}
	w.key(k)
	w.b = append(w.b, t...)
}

// appendJSON appends the encoded details to b. normalized says that d has
// been through normalize, so its raw values are already trimmed and valid.
func (d *Details) appendJSON(b []byte, normalized bool) ([]byte, error) {
	w := objWriter{b: append(b, '{'), trusted: normalized}
	w.str("owner", string(d.Owner))
	w.raw("frame", d.Frame)
	w.str("clientTimestamp", d.ClientTimestamp)
	w.int("timeoutMs", d.TimeoutMs)
	w.str("errorCode", d.ErrorCode)
	w.str("error", d.Error)
	if d.Retryable {
		w.key("retryable")
		w.b = append(w.b, "true"...)
	}
	if d.LatencyMs != nil {
		w.key("latencyMs")
		w.b = strconv.AppendInt(w.b, *d.LatencyMs, 10)
	}
	w.raw("result", d.Result)
	if d.Bus != nil {
		w.key("bus")
		bw := objWriter{b: append(w.b, '{'), trusted: normalized}
		bw.key("messageId")
		bw.b = appendJSONString(bw.b, d.Bus.MessageID, &bw.err)
		bw.raw("payload", d.Bus.Payload)
		bw.int("priority", int64(d.Bus.Priority))
		bw.int("maxRetries", int64(d.Bus.MaxRetries))
		bw.str("traceId", d.Bus.TraceID)
		bw.raw("metadata", d.Bus.Metadata)
		w.b = append(bw.b, '}')
		if bw.err != nil && w.err == nil {
			w.err = bw.err
		}
	}
	if d.Job != nil {
		// Without HTML escaping, so that raw values keep their bytes.
		var jb bytes.Buffer
		enc := json.NewEncoder(&jb)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(d.Job); err != nil {
			return nil, fmt.Errorf("encode details key job: %w", err)
		}
		w.key("job")
		w.b = append(w.b, bytes.TrimSuffix(jb.Bytes(), []byte("\n"))...)
	}
	w.int("nextRetryAt", d.NextRetryAt)
	if d.RetryCount != nil {
		w.key("retryCount")
		w.b = strconv.AppendInt(w.b, int64(*d.RetryCount), 10)
	}
	w.str("leaseOwner", d.LeaseOwner)
	w.int("leaseExpiresAt", d.LeaseExpiresAt)
	w.raw("response", d.Response)
	w.str("legacyStage", d.LegacyStage)
	w.str("legacyStatus", d.LegacyStatus)
	w.raw("mesh", d.Mesh)
	if len(d.Extra) > 0 {
		keys := make([]string, 0, len(d.Extra))
		for k := range d.Extra {
			if !isDetailsKey(k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			v, err := json.Marshal(d.Extra[k])
			if err != nil {
				return nil, fmt.Errorf("encode details key %q: %w", k, err)
			}
			w.key(k)
			w.b = append(w.b, v...)
		}
	}
	if w.err != nil {
		return nil, w.err
	}
	return append(w.b, '}'), nil
}

// appendJSONString appends s as a JSON string. Invalid UTF-8 sets *errp.
func appendJSONString(b []byte, s string, errp *error) []byte {
	b, ok := jsonscan.AppendString(b, s)
	if !ok && *errp == nil {
		*errp = errors.New("details: string is not valid UTF-8")
	}
	return b
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
