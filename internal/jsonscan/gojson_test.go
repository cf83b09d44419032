package jsonscan

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMarshalAppendersMatchEncodingJSON: strings, raw values and floats are
// written exactly as json.Marshal writes them.
func TestMarshalAppendersMatchEncodingJSON(t *testing.T) {
	t.Parallel()
	strs := []string{"", "plain", "a<b>&c", "quote\" back\\ nl\n tab\t ctl\x01", "é ü 日本", "line\u2028sep\u2029",
		"bad\xffutf8", "\x7f", "emoji 😀"}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("ab<>&\"\\\n\x00é\u2028😀 ")
	for range 500 {
		rs := make([]rune, r.IntN(12))
		for i := range rs {
			rs[i] = alphabet[r.IntN(len(alphabet))]
		}
		s := string(rs)
		if r.IntN(8) == 0 {
			s += "\xc3"
		}
		strs = append(strs, s)
	}
	for _, s := range strs {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(AppendMarshalString([]byte("x"), s))[1:], "%q", s)
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(map[string]any{"k": s, "n": []any{1, s}}))
		compact := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		want, err = json.Marshal(json.RawMessage(compact))
		require.NoError(t, err)
		require.Equal(t, string(want), string(AppendMarshalRaw(nil, compact)))
	}
	floats := []float64{0, 1, -1, 0.5, 100, 33.333333333333336, 1e-7, 1.5e-9, 1e21, 1e20, 123456789.125, -2.5e-300,
		math.MaxFloat64, math.SmallestNonzeroFloat64}
	for range 500 {
		floats = append(floats, math.Float64frombits(r.Uint64()))
	}
	for _, f := range floats {
		got, ok := AppendMarshalFloat(nil, f)
		want, err := json.Marshal(f)
		if err != nil {
			require.False(t, ok, "%v", f)
			continue
		}
		require.True(t, ok, "%v", f)
		require.Equal(t, string(want), string(got), "%v", f)
	}
}
