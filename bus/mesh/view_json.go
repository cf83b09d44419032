package mesh

import (
	"encoding/json"

	"github.com/beamdir/beam/tracing"
)

// appendView appends json.Marshal(view(row)), the data of a status event.
func appendView(b []byte, row tracing.MeshRow) ([]byte, error) {
	data, err := json.Marshal(view(row))
	return append(b, data...), err
}

// progressEvent is the data of a progress event.
type progressEvent struct {
	Actor    string  `json:"actor"`
	Hop      int     `json:"hop"`
	ID       string  `json:"id"`
	Progress float64 `json:"progress"`
}

// appendProgress appends the data of a progress event.
func appendProgress(b []byte, row tracing.MeshRow) []byte {
	data, err := json.Marshal(progressEvent{Actor: row.Actor, Hop: row.Hop, ID: row.ID, Progress: row.Progress})
	if err != nil {
		// Progress is a percentage the gateway computes, never NaN.
		return append(b, "{}"...)
	}
	return append(b, data...)
}
