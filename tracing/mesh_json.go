package tracing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/beamdir/beam/internal/jsonscan"
)

// Encode returns the step as details.mesh: the bytes json.Marshal writes
// for it, appended by hand (every hop encodes several steps). Envelope must
// be compact JSON, as bus/mesh's Envelope.Encode writes it; it is written
// as it is (json.Marshal would compact it), and the log rejects an event
// whose details are not valid JSON. The step is remembered for the writer's
// fold, which decodes it next (stepMemo).
func (s MeshStep) Encode() json.RawMessage {
	b := make([]byte, 0, 96+len(s.Envelope)+len(s.Reason)+len(s.Error))
	b = append(b, `{"kind":`...)
	b = jsonscan.AppendMarshalString(b, s.Kind)
	b = stepStr(b, `,"id":`, s.ID)
	b = stepStr(b, `,"parentId":`, s.ParentID)
	b = stepStr(b, `,"creator":`, s.Creator)
	b = stepInt(b, `,"deadlineAt":`, s.DeadlineAt)
	b = stepStr(b, `,"status":`, string(s.Status))
	if len(s.Envelope) > 0 {
		b = jsonscan.AppendMarshalRaw(append(b, `,"envelope":`...), s.Envelope)
	}
	b = stepInt(b, `,"hop":`, int64(s.Hop))
	b = stepStr(b, `,"actor":`, s.Actor)
	b = stepInt(b, `,"attempt":`, int64(s.Attempt))
	if s.Progress != 0 {
		var ok bool
		if b, ok = jsonscan.AppendMarshalFloat(append(b, `,"progress":`...), s.Progress); !ok {
			panic(fmt.Sprintf("encode mesh step: progress %v is not a JSON number", s.Progress))
		}
	}
	b = stepInt(b, `,"firstAttemptAt":`, s.FirstAttemptAt)
	b = stepInt(b, `,"nextAt":`, s.NextAt)
	b = stepStr(b, `,"reason":`, s.Reason)
	b = stepStr(b, `,"error":`, s.Error)
	if s.Sink {
		b = append(b, `,"sink":true`...)
	}
	if s.Sump {
		b = append(b, `,"sump":true`...)
	}
	if len(s.Children) > 0 {
		b = append(b, `,"children":[`...)
		for i, c := range s.Children {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonscan.AppendMarshalString(b, c)
		}
		b = append(b, ']')
	}
	b = append(b, '}')
	steps.remember(b, s)
	return b
}

func stepStr(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	return jsonscan.AppendMarshalString(append(b, key...), v)
}

func stepInt(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), v, 10)
}

// DecodeMeshStep decodes details.mesh; empty input is a zero step.
func DecodeMeshStep(raw json.RawMessage) (MeshStep, error) {
	s, err := steps.decode(raw)
	return s.clone(), err
}

// decodeMeshStep decodes details.mesh with encoding/json.
func decodeMeshStep(raw json.RawMessage) (MeshStep, error) {
	var s MeshStep
	if len(raw) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return MeshStep{}, fmt.Errorf("decode mesh step: %w", err)
	}
	return s, nil
}

// clone returns s with its own Envelope and Children.
func (s MeshStep) clone() MeshStep {
	s.Envelope = bytes.Clone(s.Envelope)
	if s.Children != nil {
		s.Children = append([]string(nil), s.Children...)
	}
	return s
}

// stepMemoMax bounds the steps stepMemo keeps; it is emptied when full.
const stepMemoMax = 4096

// stepMemo remembers the steps encoded by Encode by their bytes: the
// writer folds every event of an envelope into beam_mesh and would
// otherwise decode, with encoding/json, the step it was handed encoded a
// moment before. A hit compares the bytes in full, and decoding the bytes
// Encode wrote gives the step back, so the memo never changes a result.
type stepMemo struct {
	seed maphash.Seed
	mu   sync.Mutex
	m    map[uint64]stepEntry
}

type stepEntry struct {
	raw  []byte
	step MeshStep
}

var steps = &stepMemo{seed: maphash.MakeSeed(), m: map[uint64]stepEntry{}}

// remember records s as the decoding of b = s.Encode(), unless decoding b
// gives a different step: an envelope with characters Encode escapes
// (decoding keeps the raw bytes as written), or a string that is not
// valid UTF-8 (Encode replaces the bad bytes).
func (c *stepMemo) remember(b []byte, s MeshStep) {
	if jsonscan.MayNeedHTMLEscape([]byte(s.Envelope)) || !validUTF8(s.Kind, s.ID, s.ParentID, s.Creator,
		string(s.Status), s.Actor, s.Reason, s.Error) || !validUTF8(s.Children...) {
		return
	}
	if len(s.Children) == 0 {
		s.Children = nil // an empty list is not encoded, so it decodes as nil
	}
	e := stepEntry{raw: bytes.Clone(b), step: s.clone()}
	h := maphash.Bytes(c.seed, b)
	c.mu.Lock()
	if len(c.m) >= stepMemoMax {
		clear(c.m)
	}
	c.m[h] = e
	c.mu.Unlock()
}

// decode returns the step of raw, shared with the memo: the caller must
// not change its Envelope or Children.
func (c *stepMemo) decode(raw json.RawMessage) (MeshStep, error) {
	if len(raw) == 0 {
		return MeshStep{}, nil
	}
	h := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	got, ok := c.m[h]
	c.mu.Unlock()
	if ok && bytes.Equal(got.raw, raw) {
		return got.step, nil
	}
	return decodeMeshStep(raw)
}

func validUTF8(list ...string) bool {
	for _, v := range list {
		if !utf8.ValidString(v) {
			return false
		}
	}
	return true
}
