package beamtest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// NodeChecks runs a check script of fixtures/<dir> with node (the
// fixtures' scripts print one JSON summary {ok, fatal, checks:[{name, ok,
// ms, error}]} on stdout), logs every check, fails t unless all passed,
// and returns how many checks ran. env is added to the environment.
func NodeChecks(t testing.TB, ctx context.Context, node, dir, script string, env ...string) int {
	t.Helper()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var summary struct {
		OK     bool   `json:"ok"`
		Fatal  string `json:"fatal"`
		Checks []struct {
			Name  string `json:"name"`
			OK    bool   `json:"ok"`
			MS    int    `json:"ms"`
			Error string `json:"error"`
		} `json:"checks"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &summary); err != nil {
		t.Fatalf("%s printed no summary (%v)\nstdout:\n%s\nstderr:\n%s", script, err, stdout.String(), stderr.String())
	}
	for _, c := range summary.Checks {
		if c.OK {
			t.Logf("ok   %-75s %5d ms", c.Name, c.MS)
		} else {
			t.Errorf("FAIL %-75s %5d ms\n%s", c.Name, c.MS, c.Error)
		}
	}
	require.Empty(t, summary.Fatal)
	require.True(t, summary.OK, "stderr:\n%s", stderr.String())
	require.NoError(t, runErr)
	return len(summary.Checks)
}
