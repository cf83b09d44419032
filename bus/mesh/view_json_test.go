package mesh

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// TestViewMatchesEncodingJSON: the status and progress events' data is
// what json.Marshal wrote for them, for random rows and envelopes,
// including a stored envelope that does not decode.
func TestViewMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	strs := []string{"", "a", "bob@acme.beam.directory", "<b>&", "é 😀", "x\u2028y", "bad\xff", "q\"\\\n\t\x01"}
	str := func() string { return strs[rng.IntN(len(strs))] }
	num := func() int64 {
		if rng.IntN(2) == 0 {
			return 0
		}
		return rng.Int64N(1<<50) - 1<<40
	}
	payloads := []string{`{}`, `{"a":1}`, `{"h":"<&>","u":"\u2028 é"}`, `[1,2]`, `"s"`}
	for i := range 2000 {
		env := benchEnvelope()
		env.ID, env.Creator, env.Status.Reason = str(), str(), str()
		env.Payload = json.RawMessage(payloads[rng.IntN(len(payloads))])
		row := tracing.MeshRow{ID: str(), Nonce: str(), ParentID: str(), Creator: str(), State: tracing.State(str()),
			Status: tracing.MeshStatus(str()), Reason: str(), Error: str(), Progress: float64(num()) / 3, Hop: int(num()),
			Actor: str(), Attempt: int(num()), Envelope: tracing.RawJSON(encodeEnvelope(env)), DeadlineAt: num(),
			FirstAttemptAt: num(), NextAt: num(), Sink: rng.IntN(2) == 0, Sump: rng.IntN(2) == 0, Stale: int(num()),
			CreatedAt: num(), UpdatedAt: num(), LastSeq: num()}
		if rng.IntN(2) == 0 {
			done := num()
			row.CompletedAt = &done
		}
		if rng.IntN(10) == 0 {
			row.Envelope = tracing.RawJSON(`{"id": 1}`) // not an envelope: view keeps the raw JSON
		}
		want, err := json.Marshal(view(row))
		require.NoError(t, err)
		got, err := appendView([]byte("x"), row)
		require.NoError(t, err)
		require.Equal(t, "x"+string(want), string(got), "row %d", i)
		want, err = json.Marshal(map[string]any{"id": row.ID, "progress": row.Progress, "hop": row.Hop, "actor": row.Actor})
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendProgress(nil, row)), "row %d", i)
	}
}
