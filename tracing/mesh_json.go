package tracing

import (
	"encoding/json"
	"fmt"
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
