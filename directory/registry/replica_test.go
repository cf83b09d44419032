package registry

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A recorded statement argument survives the trip through JSON with its
// SQL type: integers stay int64 (a JSON number would come back float64),
// times become unix microseconds as the registry stores them.
func TestReplicatedArgumentsKeepTheirTypes(t *testing.T) {
	t.Parallel()
	at := time.UnixMicro(1_700_000_000_123_456)
	in := []any{int64(1) << 60, 7, 0.25, "x", true, false, nil, []byte{0, 1}, at}
	want := []any{int64(1) << 60, int64(7), 0.25, "x", true, false, nil, []byte{0, 1}, at.UnixMicro()}
	s := stmt{Q: "q"}
	for _, v := range in {
		a, err := encodeArg(v)
		require.NoError(t, err)
		s.A = append(s.A, a)
	}
	b, err := json.Marshal(change{ID: "id", Stmts: []stmt{s}})
	require.NoError(t, err)
	var back change
	require.NoError(t, json.Unmarshal(b, &back))
	require.Len(t, back.Stmts, 1)
	got := make([]any, len(back.Stmts[0].A))
	for i, a := range back.Stmts[0].A {
		got[i] = a.value()
	}
	require.Equal(t, want, got)

	_, err = encodeArg(struct{}{})
	require.Error(t, err)
}
