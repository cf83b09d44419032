package legacy_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
	"github.com/beamdir/beam/tracing/legacy"
	"github.com/beamdir/beam/tracing/legacy/legacytest"
)

// buildVolume writes a legacy directory database with n intents of five
// legacy trace events each.
func buildVolume(b testing.TB, path string, n int) {
	var sb strings.Builder
	sb.WriteString(legacytest.SchemaDirectory)
	sb.WriteString("BEGIN;\n")
	for i := 1; i <= n; i++ {
		nonce := fmt.Sprintf("vol-%06d", i)
		fmt.Fprintf(&sb, "INSERT INTO intent_log (id, nonce, from_beam_id, to_beam_id, intent_type, requested_at, completed_at, status, result_json) VALUES (%d, '%s', 'a@x.beam.directory', 'b@x.beam.directory', 'task', '2024-03-01T10:00:00Z', '2024-03-01T10:00:01Z', 'success', '{\"v\":\"1\",\"success\":true}');\n", i, nonce)
		for j, st := range [][2]string{{"sender_lookup", "success"}, {"validated", "success"}, {"dispatch", "pending"}, {"delivery", "success"}, {"completed", "success"}} {
			fmt.Fprintf(&sb, "INSERT INTO intent_trace_events (nonce, from_beam_id, to_beam_id, intent_type, stage, status, timestamp, details) VALUES ('%s', 'a@x.beam.directory', 'b@x.beam.directory', 'task', '%s', '%s', '2024-03-01T10:00:00.%03dZ', '{\"transport\":\"ws\"}');\n", nonce, st[0], st[1], j)
		}
	}
	sb.WriteString("COMMIT;\n")
	legacytest.Exec(b, path, sb.String())
}

// BenchmarkImport imports a legacy database of 500 intents (2500 trace
// events) into a fresh log per iteration; events/s is reported.
func BenchmarkImport(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		b.Run(sync, func(b *testing.B) {
			dir := b.TempDir()
			src := filepath.Join(dir, "legacy.db")
			const n = 500
			buildVolume(b, src, n)
			events := 0
			for i := 0; b.Loop(); i++ {
				lg, err := tracing.Open(b.Context(), tracing.Config{Path: filepath.Join(dir, fmt.Sprintf("beam-%d.db", i)), Synchronous: sync})
				require.NoError(b, err)
				rep, err := legacy.Import(b.Context(), src, lg, legacy.Options{})
				require.NoError(b, err)
				require.Equal(b, n, rep.Intents)
				events += rep.Events
				require.NoError(b, lg.Close())
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
