package mesh

import (
	"encoding/json"
	"testing"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/stretchr/testify/require"
)

func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"mesh":{"outputs":[{"a":1},{"b":2}],"next":["x@d"],"headers":{"k":"v"}}}`))
	f.Add([]byte(`{"plain":"payload"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[1,2,3]`))
	f.Add([]byte(`{"mesh":{"outputs":[]}}`))
	f.Add([]byte(`{"mesh":7}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeReply(b, 1024)
		if err != nil {
			return
		}
		for _, o := range r.Outputs {
			require.True(t, json.Valid(o))
			require.LessOrEqual(t, len(o), 1024)
		}
		require.LessOrEqual(t, len(r.Outputs), maxOutputs)
		// A reply re-encoded in the mesh member decodes to the same outputs.
		enc, err := json.Marshal(map[string]any{"mesh": r})
		require.NoError(t, err)
		r2, err := decodeReply(enc, 1<<20)
		require.NoError(t, err)
		require.Len(t, r2.Outputs, len(r.Outputs))
		for i := range r.Outputs {
			require.JSONEq(t, string(r.Outputs[i]), string(r2.Outputs[i]))
		}
	})
}

func FuzzParseRoute(f *testing.F) {
	f.Add([]byte(`["a@d","b@d"]`), "")
	f.Add([]byte(`{"curr":"a@d","next":["b@d"]}`), "")
	f.Add([]byte(``), "a@d")
	f.Add([]byte(`{"next":[]}`), "")
	f.Add([]byte(`"x"`), "")
	f.Fuzz(func(t *testing.T, raw []byte, actor string) {
		actors, err := parseRoute(raw, actor)
		if err != nil {
			var ie *httpjson.Error
			require.ErrorAs(t, err, &ie)
			require.Equal(t, 400, ie.Status)
			return
		}
		r, err := wire.NewMeshRoute(actors, defaultMaxHops)
		if err != nil {
			return
		}
		// A valid route walks to its end in exactly len(actors) shifts.
		n := 0
		for !r.Done() {
			r = r.Shift()
			n++
		}
		require.Equal(t, len(actors), n)
		require.Equal(t, actors, r.Prev)
	})
}
