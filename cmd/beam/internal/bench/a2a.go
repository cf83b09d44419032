package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// ModeA2A sends A2A 1.0 messages (JSON-RPC SendMessage, blocking) to a
// declared pipeline routed through Config.Hops recipients, and counts one
// "intent" per task that completes. The directory must declare the
// pipeline a2APipeline over the run's recipients (A2APipelinesFile); beam
// bench does when it starts the directory.
const ModeA2A Mode = "a2a"

// a2APipeline is the name of the pipeline a ModeA2A run sends to.
const a2APipeline = "bench"

// A2APipelinesFile is the --pipelines file declaring a2APipeline over the
// first hops recipients of a run in org.
func A2APipelinesFile(org string, hops, recipients int) ([]byte, error) {
	if hops <= 0 {
		hops = defaultHops
	}
	route := make([]string, hops)
	for i := range route {
		route[i] = fmt.Sprintf("r-%d@%s.beam.directory", i%max(1, recipients), org)
	}
	return json.Marshal(map[string]any{"pipelines": []map[string]any{{
		"name": a2APipeline, "description": "beam bench: the payload through the run's recipients", "route": route,
	}}})
}

// a2aDriver sends A2A messages for ModeA2A.
type a2aDriver struct{ env *env }

func newA2ADriver(_ context.Context, env *env) (driver, error) { return &a2aDriver{env: env}, nil }

func (d *a2aDriver) Close() error { return nil }

// Send sends one message as from and waits for the completed task; to is
// not used (the pipeline's route is fixed).
func (d *a2aDriver) Send(ctx context.Context, from, _ *agent) error {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": map[string]any{
		"message": map[string]any{"messageId": "bench", "role": "ROLE_USER",
			"parts": []map[string]any{{"data": json.RawMessage(d.env.Config.payload())}}},
	}})
	if err != nil {
		return err
	}
	hdr := http.Header{"Authorization": {"Bearer " + from.APIKey}, "Content-Type": {"application/json"}}
	_, b, err := call(ctx, d.env.HTTP, http.MethodPost, d.env.URL+"/a2a/pipelines/"+a2APipeline, body, hdr, http.StatusOK)
	if err != nil {
		return err
	}
	var res struct {
		Result struct {
			Task struct {
				Status struct {
					State string `json:"state"`
				} `json:"status"`
			} `json:"task"`
		} `json:"result"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return failure("BAD_RESPONSE", "SendMessage answered %.200q", b)
	}
	if res.Error != nil {
		return failure(fmt.Sprintf("A2A_%d", -res.Error.Code), "%s", res.Error.Message)
	}
	if st := res.Result.Task.Status.State; st != "TASK_STATE_COMPLETED" {
		return failure(strings.TrimPrefix(st, "TASK_STATE_"), "task ended %s", st)
	}
	return nil
}
