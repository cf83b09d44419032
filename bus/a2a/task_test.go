package a2a

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

func TestTaskStateFollowsTheEnvelopeStatus(t *testing.T) {
	t.Parallel()
	for status, want := range map[tracing.MeshStatus][2]string{
		tracing.MeshPending:   {"TASK_STATE_SUBMITTED", "submitted"},
		tracing.MeshRunning:   {"TASK_STATE_WORKING", "working"},
		tracing.MeshPaused:    {"TASK_STATE_INPUT_REQUIRED", "input-required"},
		tracing.MeshSucceeded: {"TASK_STATE_COMPLETED", "completed"},
		tracing.MeshFailed:    {"TASK_STATE_FAILED", "failed"},
		tracing.MeshCanceled:  {"TASK_STATE_CANCELED", "canceled"},
		tracing.MeshRetrying:  {"TASK_STATE_WORKING", "working"},
		tracing.MeshUnknown:   {"TASK_STATE_UNSPECIFIED", "unknown"},
		"bogus":               {"TASK_STATE_UNSPECIFIED", "unknown"},
	} {
		require.Equal(t, want[0], v10.state(status), status)
		require.Equal(t, want[1], v03.state(status), status)
	}
}

// TestWorkingFilterKeepsRetryingTasks: ListTasks filtered by working keeps
// the envelopes that are running or retrying.
func TestWorkingFilterKeepsRetryingTasks(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"TASK_STATE_WORKING", "working"} {
		got, ok := statusOf(name)
		require.True(t, ok)
		require.Equal(t, []tracing.MeshStatus{tracing.MeshRunning, tracing.MeshRetrying}, got)
	}
	_, ok := statusOf("unknown")
	require.False(t, ok)
}

func TestPayloadOfAMessage(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ msg, want, err string }{
		"data part, 1.0":        {`{"parts":[{"data":{"a":1}}]}`, `{"a":1}`, ""},
		"data part, 0.3":        {`{"parts":[{"kind":"text","text":"ignored"},{"kind":"data","data":{"a":1}}]}`, `{"a":1}`, ""},
		"text that is JSON":     {`{"parts":[{"text":" {\"a\":2} "}]}`, `{"a":2}`, ""},
		"plain text":            {`{"parts":[{"text":"hello "},{"kind":"text","text":"world"}]}`, `{"text":"hello world"}`, ""},
		"no parts":              {`{"parts":[]}`, `{"text":""}`, ""},
		"data that is an array": {`{"parts":[{"data":[1]}]}`, "", "must be a JSON object"},
		"empty part":            {`{"parts":[{}]}`, "", "text or data"},
		"file part":             {`{"parts":[{"kind":"file","file":{"uri":"https://x"}}]}`, "", "only text and data"},
	} {
		var m message
		require.NoError(t, json.Unmarshal([]byte(tc.msg), &m), name)
		got, err := payloadOf(&m)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, name)
			continue
		}
		require.NoError(t, err, name)
		require.JSONEq(t, tc.want, string(got), name)
	}
}

// FuzzSendParams decodes any JSON-RPC params as a send and turns its
// message into a payload: never a panic, and a payload is always a JSON
// object.
func FuzzSendParams(f *testing.F) {
	for _, seed := range []string{
		`{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"data":{"a":1}}]},"configuration":{"returnImmediately":true}}`,
		`{"message":{"kind":"message","messageId":"m","role":"user","parts":[{"kind":"text","text":"{\"x\":[1,2]}"}]},"configuration":{"blocking":false}}`,
		`{"message":{"parts":[{"text":"hi"},{"data":null}]}}`,
		`{"message":null}`, `[]`, `{"message":{"parts":[{"kind":"file"}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p sendParams
		if json.Unmarshal(b, &p) != nil || p.Message == nil {
			return
		}
		_ = p.immediate()
		payload, err := payloadOf(p.Message)
		if err != nil {
			return
		}
		var obj map[string]any
		require.NoError(t, json.Unmarshal(payload, &obj), "payload %q of %q", payload, b)
	})
}
