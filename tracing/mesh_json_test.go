package tracing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// randomStep returns a step with random fields; envelopes are compact JSON,
// as Encode requires.
func randomStep(r *rand.Rand) MeshStep {
	strs := []string{"", "a", "bob@acme.beam.directory", "<b>&</b>", "日本 é", "x\u2028y", "bad\xff", "q\"\\\n\t"}
	pick := func() string { return strs[r.IntN(len(strs))] }
	num := func() int64 {
		if r.IntN(2) == 0 {
			return 0
		}
		return r.Int64N(1 << 45)
	}
	s := MeshStep{Kind: pick(), ID: pick(), ParentID: pick(), Creator: pick(), DeadlineAt: num(),
		Status: MeshStatus(pick()), Hop: int(num() % 100), Actor: pick(), Attempt: int(num() % 9),
		FirstAttemptAt: num(), NextAt: num(), Reason: pick(), Error: pick(), Sink: r.IntN(2) == 0, Sump: r.IntN(2) == 0}
	if r.IntN(2) == 0 {
		s.Progress = []float64{100, 33.333333333333336, 1e-7, 66.5}[r.IntN(4)]
	}
	if r.IntN(2) == 0 {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(map[string]any{"id": pick(), "payload": map[string]any{"n": r.IntN(1000), "s": pick()}}); err != nil {
			panic(err)
		}
		s.Envelope = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	switch r.IntN(3) {
	case 0:
		s.Children = []string{}
	case 1:
		s.Children = []string{pick(), pick()}
	}
	return s
}

// TestMeshStepEncodeMatchesEncodingJSON: Encode writes what json.Marshal
// writes, and DecodeMeshStep gives back exactly what encoding/json decodes
// from those bytes.
func TestMeshStepEncodeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 3000 {
		s := randomStep(r)
		want, err := json.Marshal(s)
		require.NoError(t, err)
		got := s.Encode()
		require.Equal(t, string(want), string(got), "step %d", i)
		var plain MeshStep
		require.NoError(t, json.Unmarshal(got, &plain))
		decoded, err := DecodeMeshStep(got)
		require.NoError(t, err)
		require.Equal(t, plain, decoded, "step %d", i)
	}
	// A caller's changes to a decoded step do not reach the next decode.
	s := MeshStep{Kind: meshKindFanOut, Envelope: []byte(`{"id":"e"}`), Children: []string{"c1"}}
	raw := s.Encode()
	d, err := DecodeMeshStep(raw)
	require.NoError(t, err)
	d.Envelope[2], d.Children[0] = 'X', "changed"
	again, err := DecodeMeshStep(raw)
	require.NoError(t, err)
	require.Equal(t, s, again)
	_, err = DecodeMeshStep(json.RawMessage(`{"kind":`))
	require.Error(t, err)
}

func BenchmarkMeshStepEncodeDecode(b *testing.B) {
	s := MeshStep{Kind: MeshKindHop, Status: MeshRunning, Hop: 2, Actor: "bob@acme.beam.directory", Attempt: 1,
		Progress: 66.66666666666667, FirstAttemptAt: 1764130000000,
		Envelope: []byte(fmt.Sprintf(`{"id":"e","route":{"prev":["a"],"curr":"b","next":["c"]},"payload":{"x":%q}}`, "filler"))}
	for b.Loop() {
		if _, err := DecodeMeshStep(s.Encode()); err != nil {
			b.Fatal(err)
		}
	}
}
