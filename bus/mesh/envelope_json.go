package mesh

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/beamdir/beam/internal/jsonscan"
	"github.com/beamdir/beam/internal/tricks"
)

// envelopeJSONOn is the mesh-envelope-json trick: envelopes are encoded
// by hand; off, through encoding/json.
var envelopeJSONOn = tricks.On("mesh-envelope-json")

// appendEnvelope appends e exactly as a json.Encoder with HTML escaping off
// writes it (without the newline): the fields in declaration order, the
// omitempty ones left out when empty, nil lists and maps as null, header
// names sorted, the payload compacted. Every hop encodes the envelope for
// the log, the actor's frame and each SSE status event, and reflection
// was a measurable part of the server's CPU per hop. The payload must be
// valid JSON.
func appendEnvelope(b []byte, e Envelope) ([]byte, error) {
	if !envelopeJSONOn {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e); err != nil {
			return nil, fmt.Errorf("encode envelope: %w", err)
		}
		return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...), nil
	}
	b = append(b, `{"id":`...)
	b = appendString(b, e.ID)
	if e.ParentID != "" {
		b = append(b, `,"parent_id":`...)
		b = appendString(b, e.ParentID)
	}
	b = append(b, `,"route":{"prev":`...)
	b = appendStrings(b, e.Route.Prev)
	b = append(b, `,"curr":`...)
	b = appendString(b, e.Route.Curr)
	b = append(b, `,"next":`...)
	b = appendStrings(b, e.Route.Next)
	b = append(b, `},"headers":`...)
	if e.Headers == nil {
		b = append(b, "null"...)
	} else {
		keys := make([]string, 0, len(e.Headers))
		for k := range e.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(appendString(b, k), ':')
			b = appendString(b, e.Headers[k])
		}
		b = append(b, '}')
	}
	s := e.Status
	b = append(b, `,"status":{"phase":`...)
	b = appendString(b, s.Phase)
	if s.Actor != "" {
		b = append(b, `,"actor":`...)
		b = appendString(b, s.Actor)
	}
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(s.Attempt), 10)
	b = append(b, `,"max_attempts":`...)
	b = strconv.AppendInt(b, int64(s.MaxAttempts), 10)
	if s.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, s.Reason)
	}
	b = append(b, `,"created_at":`...)
	b = appendString(b, s.CreatedAt)
	b = append(b, `,"updated_at":`...)
	b = appendString(b, s.UpdatedAt)
	if s.DeadlineAt != "" {
		b = append(b, `,"deadline_at":`...)
		b = appendString(b, s.DeadlineAt)
	}
	b = append(b, `},"payload":`...)
	if len(e.Payload) == 0 {
		b = append(b, "null"...)
	} else {
		buf := bytes.NewBuffer(b)
		if err := json.Compact(buf, e.Payload); err != nil {
			return nil, fmt.Errorf("payload: %w", err)
		}
		b = buf.Bytes()
	}
	b = append(b, `,"hop":`...)
	b = strconv.AppendInt(b, int64(e.Hop), 10)
	if e.FanoutIndex != 0 {
		b = append(b, `,"fanout_index":`...)
		b = strconv.AppendInt(b, int64(e.FanoutIndex), 10)
	}
	b = append(b, `,"creator":`...)
	b = appendString(b, e.Creator)
	if e.Author != "" {
		b = append(b, `,"author":`...)
		b = appendString(b, e.Author)
	}
	if e.PrevActor != "" {
		b = append(b, `,"prev_actor":`...)
		b = appendString(b, e.PrevActor)
	}
	return append(b, '}'), nil
}

func appendStrings(b []byte, list []string) []byte {
	if list == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// appendString appends s as encoding/json writes it with HTML escaping
// off: that is jsonscan.AppendString for valid UTF-8 without U+2028 and
// U+2029, which encoding/json escapes, as it replaces invalid bytes.
func appendString(b []byte, s string) []byte {
	n := len(b)
	if out, ok := jsonscan.AppendString(b, s); ok && (isASCII(s) || !strings.ContainsAny(s, "\u2028\u2029")) {
		return out
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return append(b[:n], bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
