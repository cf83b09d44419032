package beam_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	// The packages that own a lifecycle register it when they are
	// linked; beam links all of them.
	_ "github.com/beamdir/beam"
	"github.com/beamdir/beam/tracing"
)

var updateLifecycles = flag.Bool("update-lifecycles", false, "rewrite docs/lifecycles.md from the registered lifecycle tables")

// TestLifecyclesDoc: docs/lifecycles.md is the registered transition
// tables, rendered; it fails when the file and the tables differ (run with
// -update-lifecycles to regenerate the file).
func TestLifecyclesDoc(t *testing.T) {
	lcs := tracing.Lifecycles()
	var names []string
	for _, lc := range lcs {
		names = append(names, lc.Name)
	}
	require.Equal(t, []string{"bus message", "intent", "job", "outbox row", "pipeline envelope"}, names,
		"every system that keeps state in the log registers its lifecycle")
	want := tracing.Markdown(lcs)
	path := filepath.Join("docs", "lifecycles.md")
	if *updateLifecycles {
		require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, string(got), "docs/lifecycles.md drifted from the lifecycle tables: regenerate it with "+
		"go test . -run TestLifecyclesDoc -update-lifecycles")
}
