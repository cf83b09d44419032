package mesh

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// An envelope remembered when it is encoded for the log decodes from the
// memo exactly as decodeEnvelope decodes its bytes; one that decodeEnvelope
// refuses is not remembered.
func TestMemoRememberedEqualsDecoded(t *testing.T) {
	t.Parallel()
	base := envelope{ID: "e1", Creator: "c@acme.beam.directory", Payload: json.RawMessage(`{"a":1}`),
		Route:  meshRoute{Prev: []string{"a@acme.beam.directory"}, Curr: "b@acme.beam.directory", Next: []string{}},
		Status: status{Phase: "pending", CreatedAt: "2026-01-01T00:00:00Z"}, Headers: map[string]string{"k": "v"}}
	with := func(f func(*envelope)) envelope {
		e := cloneEnvelope(base)
		f(&e)
		return e
	}
	for name, env := range map[string]envelope{
		"plain":               base,
		"nil lists and map":   with(func(e *envelope) { e.Route.Prev, e.Route.Next, e.Headers = nil, nil, nil }),
		"spaced payload":      with(func(e *envelope) { e.Payload = json.RawMessage("{ \"a\" :\n [1, 2] }") }),
		"html and unicode":    with(func(e *envelope) { e.Payload = json.RawMessage(`{"t":"<a>&\u2028 é"}`); e.Headers["h"] = "<&>" }),
		"end of route":        with(func(e *envelope) { e.Route.Curr = ""; e.Hop = 3; e.FanoutIndex = 2; e.ParentID = "p" }),
		"null payload":        with(func(e *envelope) { e.Payload = json.RawMessage(`null`) }),
		"scalar payload":      with(func(e *envelope) { e.Payload = json.RawMessage(` "s" `) }),
		"status with details": with(func(e *envelope) { e.Status = status{Phase: "processing", Attempt: 2, MaxAttempts: 3, Reason: "r"} }),
	} {
		t.Run(name, func(t *testing.T) {
			b := encodeStored(env)
			want, err := decodeEnvelope(b)
			require.NoError(t, err)
			got, err := envelopes.decode(b)
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Equal(t, string(encodeEnvelope(want)), string(encodeEnvelope(got)))
		})
	}
	for name, env := range map[string]envelope{
		"no id":     with(func(e *envelope) { e.ID = "" }),
		"bad actor": with(func(e *envelope) { e.Route.Next = []string{"x-sink"} }),
	} {
		t.Run(name, func(t *testing.T) {
			b := encodeStored(env)
			_, err := envelopes.decode(b)
			require.Error(t, err)
		})
	}
}
