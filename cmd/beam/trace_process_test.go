package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// stdoutOf runs beam args in r's directory and returns its standard output
// alone, failing the test when it exits non-zero.
func (r *cliRunner) stdoutOf(args ...string) string {
	r.t.Helper()
	cmd := exec.CommandContext(r.ctx, beamtest.Binary(r.t), args...)
	cmd.Dir, cmd.Env = r.dir, r.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(r.t, err, "beam %s:\n%s%s", strings.Join(args, " "), out, stderr.String())
	return string(out)
}

// requireSameTrace runs each beam command line and requires the same
// standard output from all of them: a trace that is not empty.
func (r *cliRunner) requireSameTrace(want []string, lines ...[]string) string {
	r.t.Helper()
	first := r.stdoutOf(lines[0]...)
	for _, w := range want {
		require.Contains(r.t, first, w, strings.Join(lines[0], " "))
	}
	for _, l := range lines[1:] {
		require.Equal(r.t, first, r.stdoutOf(l...), "beam %s prints another trace than beam %s", strings.Join(l, " "), strings.Join(lines[0], " "))
	}
	return first
}

// TestTraceJobBothWays traces an Intent Protocol job by the id its publish
// printed, with and without its job: prefix, from the data directory and
// from the running server: the same table each way.
func TestTraceJobBothWays(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	r := newCLIRunner(t, p)
	secret, err := os.ReadFile(filepath.Join(p.DataDir, "intent.secret"))
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, p.IntentURL()+"/intent", strings.NewReader(`{"goal":"send","payload":{"to":"x"}}`))
	require.NoError(t, err)
	req.Header.Set("X-API-KEY", strings.TrimSpace(string(secret)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
	var job struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(body, &job), string(body))
	require.NotEmpty(t, job.ID)

	local := []string{"trace", "--data-dir", p.DataDir}
	remote := []string{"trace", "--url", p.URL(), "--data-dir", p.DataDir}
	r.requireSameTrace([]string{"nonce job:" + job.ID, `"payload":{"to":"x"}`},
		append(local, job.ID), append(remote, job.ID), append(local, "job:"+job.ID), append(remote, "job:"+job.ID))
	jsonOut := r.requireSameTrace([]string{`"nonce":"job:` + job.ID + `"`},
		append(local, "--json", job.ID), append(remote, "--json", job.ID))
	require.Len(t, strings.Split(strings.TrimSpace(jsonOut), "\n"), strings.Count(r.stdoutOf(append(local, job.ID)...), "\n")-1)

	out := r.fail(append(remote, "no-such-id")...)
	require.Contains(t, out, `has no events for "no-such-id" (an intent's nonce, a job id or an envelope id)`)
}
