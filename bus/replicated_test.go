package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// switchReplicator accepts every batch until fenced is set, then reports
// the log taken over, as the cluster's replicator does once another node
// fenced this node's log.
type switchReplicator struct{ fenced atomic.Bool }

func (r *switchReplicator) Replicate(context.Context, []byte, int64) error {
	if r.fenced.Load() {
		return fmt.Errorf("log taken over: %w", tracing.ErrFenced)
	}
	return nil
}

// TestSendNotReplicatedIsUnavailable: a durable send whose events the
// cluster's replicated storage did not take is not acknowledged: 503
// NOT_REPLICATED with Retry-After, not a 500, so the client tries again.
func TestSendNotReplicatedIsUnavailable(t *testing.T) {
	t.Parallel()
	repl := &switchReplicator{}
	tb := setup(t, func(o *setupOpts) { o.repl = repl })
	alice, bob := tb.register("alice"), tb.register("bob")
	repl.fenced.Store(true)
	raw, err := json.Marshal(map[string]any{"from": alice.id, "to": bob.id, "intent": "x"})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, tb.srv.URL+"/v1/beam/send", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testBusKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, codeNotReplicated, body["errorCode"], body)
}
