package mesh

import (
	"encoding/json"
	"strconv"

	"github.com/beamdir/beam/internal/jsonscan"
	"github.com/beamdir/beam/internal/tricks"
	"github.com/beamdir/beam/tracing"
)

// viewJSONOn is the mesh-view-json trick: the status and progress events
// of a pipeline's SSE stream are encoded by hand; off, through
// encoding/json.
var viewJSONOn = tricks.On("mesh-view-json")

// appendView appends json.Marshal(view(row)), written by hand: every SSE
// status event encodes it, and encoding/json's reflection and its
// compaction of the envelope were a measurable part of the server's CPU
// per hop. The fields are MeshRow's in declaration order (its own
// envelope shadowed) and then the client's view of the envelope, as
// encoding/json orders them.
func appendView(b []byte, row tracing.MeshRow) ([]byte, error) {
	e, err := envelopeOf(row)
	if err != nil || !viewJSONOn {
		// The stored envelope as it is (never the case for envelopes this
		// package stored): encoding/json compacts it.
		data, err := json.Marshal(view(row))
		return append(b, data...), err
	}
	b = append(b, `{"id":`...)
	b = jsonscan.AppendMarshalString(b, row.ID)
	b = viewStr(b, `,"nonce":`, row.Nonce, false)
	b = viewStr(b, `,"parentId":`, row.ParentID, true)
	b = viewStr(b, `,"creator":`, row.Creator, false)
	b = viewStr(b, `,"state":`, string(row.State), false)
	b = viewStr(b, `,"status":`, string(row.Status), false)
	b = viewStr(b, `,"reason":`, row.Reason, true)
	b = viewStr(b, `,"error":`, row.Error, true)
	var ok bool
	if b, ok = jsonscan.AppendMarshalFloat(append(b, `,"progress":`...), row.Progress); !ok {
		data, err := json.Marshal(view(row)) // the same error encoding/json gives
		return append(b, data...), err
	}
	b = viewInt(b, `,"hop":`, int64(row.Hop), false)
	b = viewStr(b, `,"actor":`, row.Actor, true)
	b = viewInt(b, `,"attempt":`, int64(row.Attempt), false)
	b = viewInt(b, `,"deadlineAt":`, row.DeadlineAt, true)
	b = viewInt(b, `,"firstAttemptAt":`, row.FirstAttemptAt, true)
	b = viewInt(b, `,"nextAt":`, row.NextAt, true)
	b = strconv.AppendBool(append(b, `,"sink":`...), row.Sink)
	b = strconv.AppendBool(append(b, `,"sump":`...), row.Sump)
	b = viewInt(b, `,"stale":`, int64(row.Stale), false)
	b = viewInt(b, `,"createdAt":`, row.CreatedAt, false)
	b = viewInt(b, `,"updatedAt":`, row.UpdatedAt, false)
	if row.CompletedAt != nil {
		b = strconv.AppendInt(append(b, `,"completedAt":`...), *row.CompletedAt, 10)
	}
	b = viewInt(b, `,"lastSeq":`, row.LastSeq, false)
	b = jsonscan.AppendMarshalRaw(append(b, `,"envelope":`...), encodeEnvelope(e))
	return append(b, '}'), nil
}

func viewStr(b []byte, key, v string, omitEmpty bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	return jsonscan.AppendMarshalString(append(b, key...), v)
}

func viewInt(b []byte, key string, v int64, omitEmpty bool) []byte {
	if omitEmpty && v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), v, 10)
}

// appendProgress appends the data of a progress event: what json.Marshal
// writes for the map {id, progress, hop, actor} (keys sorted).
func appendProgress(b []byte, row tracing.MeshRow) []byte {
	if !viewJSONOn {
		data, _ := json.Marshal(map[string]any{"id": row.ID, "progress": row.Progress, "hop": row.Hop, "actor": row.Actor})
		return append(b, data...)
	}
	b = jsonscan.AppendMarshalString(append(b, `{"actor":`...), row.Actor)
	b = strconv.AppendInt(append(b, `,"hop":`...), int64(row.Hop), 10)
	b = jsonscan.AppendMarshalString(append(b, `,"id":`...), row.ID)
	b, _ = jsonscan.AppendMarshalFloat(append(b, `,"progress":`...), row.Progress)
	return append(b, '}')
}
