package mesh

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// TestHubDropsFlyForSlowSubscriber: FLY events go to every subscriber with
// room in its bounded buffer; for a subscriber that does not read they are
// dropped and counted, and the subscriber stays open (FLY events are
// ephemeral, so there is nothing to resume). A status event that does not
// fit closes the slow subscriber instead, which resumes from the log.
func TestHubDropsFlyForSlowSubscriber(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	h := newHub(m)
	slow := h.subscribe("e1")
	fast := h.subscribe("e1")
	other := h.subscribe("e2")

	const extra = 7
	for i := range subBuffer + extra {
		data := json.RawMessage(fmt.Sprintf(`{"token":%d}`, i))
		n := h.fly("e1", data)
		want := 2
		if i >= subBuffer {
			want = 1 // only the subscriber that reads gets it
		}
		require.Equal(t, want, n, "event %d", i)
		got := <-fast.ch
		require.JSONEq(t, string(data), string(got.fly))
	}
	require.Equal(t, float64(extra), counter(t, m.flyDropped))
	require.Len(t, slow.ch, subBuffer)
	require.Empty(t, other.ch, "FLY events of one envelope never reach another's subscribers")
	select {
	case <-slow.done:
		require.FailNow(t, "a dropped FLY event must not close the subscriber")
	default:
	}
	// The slow subscriber still has the first subBuffer events, in order.
	for i := range subBuffer {
		ev := <-slow.ch
		require.JSONEq(t, fmt.Sprintf(`{"token":%d}`, i), string(ev.fly))
	}

	// Fill it again with FLY events; a status event that does not fit
	// closes it (counted once) and leaves the reader untouched.
	for range subBuffer {
		h.fly("e1", json.RawMessage(`1`))
		<-fast.ch
	}
	h.status(tracing.MeshRow{ID: "e1", Status: tracing.MeshRunning, LastSeq: 9})
	h.status(tracing.MeshRow{ID: "e1", Status: tracing.MeshSucceeded, LastSeq: 10})
	<-slow.done
	require.Equal(t, 1.0, counter(t, m.lagged))
	require.Equal(t, tracing.MeshRunning, (<-fast.ch).row.Status)
	require.Equal(t, tracing.MeshSucceeded, (<-fast.ch).row.Status)
	select {
	case <-fast.done:
		require.FailNow(t, "a subscriber that keeps up stays open")
	default:
	}

	// Nothing is published for an envelope without subscribers, and the
	// counters are exported under their documented names.
	h.unsubscribe("e1", slow)
	h.unsubscribe("e1", fast)
	require.Zero(t, h.fly("e1", json.RawMessage(`1`)))
	require.False(t, h.has("e1"))
	families, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	require.True(t, names["beam_mesh_fly_dropped_total"])
	require.True(t, names["beam_mesh_subscribers_lagged_total"])
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
