package beamtest

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// Rows runs query on db and returns its rows as column → value maps (text
// as strings), without the columns named in drop: what tests compare
// between two databases whose rows differ only there (a log's seqs).
func Rows(t testing.TB, db *sqlx.DB, query string, drop ...string) []map[string]any {
	t.Helper()
	rows, err := db.Queryx(query)
	require.NoError(t, err, query)
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		m := map[string]any{}
		require.NoError(t, rows.MapScan(m))
		for k, v := range m {
			if b, ok := v.([]byte); ok {
				m[k] = string(b)
			}
		}
		for _, k := range drop {
			delete(m, k)
		}
		out = append(out, m)
	}
	require.NoError(t, rows.Err())
	return out
}
