package tracing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Encode returns the step as details.mesh (json.Marshal of the step).
// A progress that is not a JSON number (NaN, an infinity) is a programming
// error and panics.
func (s MeshStep) Encode() json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("encode mesh step: %v", err))
	}
	return b
}

// DecodeMeshStep decodes details.mesh; empty input is a zero step.
func DecodeMeshStep(raw json.RawMessage) (MeshStep, error) {
	var s MeshStep
	if len(raw) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return MeshStep{}, fmt.Errorf("decode mesh step: %w", err)
	}
	return s, nil
}

// meshKept is a step kept next to the bytes it was encoded to.
type meshKept struct {
	raw  json.RawMessage
	step MeshStep
}

// SetMesh sets details.mesh to s.Encode(). When the step reads back
// unchanged from those bytes (valid UTF-8 strings; an envelope that is
// compact and has nothing json.Marshal escapes), the details also keep it,
// so the log's writer folds an appended event without decoding the step
// it was just given.
func (d *Details) SetMesh(s MeshStep) {
	d.Mesh = s.Encode()
	d.mesh = nil
	for _, v := range [...]string{s.Kind, s.ID, s.ParentID, s.Creator, string(s.Status), s.Actor, s.Reason, s.Error} {
		if !utf8.ValidString(v) {
			return
		}
	}
	if bytes.ContainsAny(s.Envelope, " \t\r\n<>&\u2028\u2029") {
		return
	}
	kept := s
	kept.Children = nil // the fold does not read them
	d.mesh = &meshKept{raw: d.Mesh, step: kept}
}

// meshStep returns DecodeMeshStep(d.Mesh), without decoding when SetMesh
// set those bytes. An undecodable step is a zero one.
func (d *Details) meshStep() MeshStep {
	if k := d.mesh; k != nil && len(d.Mesh) == len(k.raw) && &d.Mesh[0] == &k.raw[0] {
		return k.step
	}
	st, _ := DecodeMeshStep(d.Mesh)
	return st
}
