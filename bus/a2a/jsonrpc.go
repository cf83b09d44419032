package a2a

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// maxBody bounds a request body: a payload of the mesh's largest size and
// room for the message around it.
const maxBody = mesh.DefaultMaxPayloadBytes + 64<<10

type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// methods maps both versions' method names to the operation: 1.0 names
// first, then the 0.3 ones.
var methods = map[string]struct {
	op string
	v  version
}{
	"SendMessage": {"send", v10}, "SendStreamingMessage": {"stream", v10}, "GetTask": {"get", v10},
	"ListTasks": {"list", v10}, "CancelTask": {"cancel", v10}, "SubscribeToTask": {"subscribe", v10},
	"CreateTaskPushNotificationConfig": {"push", v10}, "GetTaskPushNotificationConfig": {"push", v10},
	"ListTaskPushNotificationConfigs": {"push", v10}, "ListTaskPushNotificationConfig": {"push", v10},
	"DeleteTaskPushNotificationConfig": {"push", v10},
	"GetExtendedAgentCard":             {"extended", v10},

	"message/send": {"send", v03}, "message/stream": {"stream", v03}, "tasks/get": {"get", v03},
	"tasks/cancel": {"cancel", v03}, "tasks/resubscribe": {"subscribe", v03},
	"tasks/pushNotificationConfig/set": {"push", v03}, "tasks/pushNotificationConfig/get": {"push", v03},
	"tasks/pushNotificationConfig/list": {"push", v03}, "tasks/pushNotificationConfig/delete": {"push", v03},
	"agent/getAuthenticatedExtendedCard": {"extended", v03},
}

func writeRPC(w http.ResponseWriter, id json.RawMessage, result any, e *a2aError) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	resp := rpcResponse{JSONRPC: "2.0", ID: id, Result: result}
	if e != nil {
		resp.Result = nil
		resp.Error = &rpcError{Code: e.Code, Message: e.Msg, Data: map[string]string{"reason": e.Reason}}
	}
	httpjson.Write(w, http.StatusOK, resp)
}

// rpcCall is one authenticated JSON-RPC request.
type rpcCall struct {
	caller string
	req    rpcRequest
	op     string
	v      version
	params json.RawMessage
}

// readRPC authenticates and parses a JSON-RPC request; it has answered
// when ok is false.
func (s *Server) readRPC(w http.ResponseWriter, r *http.Request) (c rpcCall, ok bool) {
	caller, err := s.caller(r)
	if err != nil {
		mesh.Unauthorized(w, err)
		return c, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeRPC(w, nil, nil, &a2aError{Code: -32700, Msg: "could not read the request body"})
		return c, false
	}
	if len(body) > maxBody {
		httpjson.WriteError(w, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "the request body is larger than the largest payload allows")
		return c, false
	}
	var req rpcRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeRPC(w, nil, nil, &a2aError{Code: -32700, Msg: "parse error: the body is not a JSON-RPC request"})
		return c, false
	}
	if req.JSONRPC != "2.0" || req.Method == "" {
		writeRPC(w, req.ID, nil, &a2aError{Code: -32600, Msg: `invalid request: want {"jsonrpc":"2.0","id","method","params"}`})
		return c, false
	}
	m, known := methods[req.Method]
	if !known {
		writeRPC(w, req.ID, nil, &a2aError{Code: -32601, Msg: "method not found: " + req.Method})
		return c, false
	}
	if v := strings.TrimSpace(r.Header.Get("A2A-Version")); v != "" && !supportedVersion(v) {
		writeRPC(w, req.ID, nil, &a2aError{Code: -32009, Msg: "A2A version " + v + " is not supported: this server speaks 1.0 and 0.3"})
		return c, false
	}
	params := req.Params
	if len(bytes.TrimSpace(params)) == 0 {
		params = json.RawMessage("{}")
	}
	return rpcCall{caller: caller, req: req, op: m.op, v: m.v, params: params}, true
}

// supportedVersion reports whether an A2A-Version header names a version
// this server speaks (1.0 or 0.3, with any patch).
func supportedVersion(v string) bool {
	return v == "1.0" || v == "0.3" || strings.HasPrefix(v, "1.0.") || strings.HasPrefix(v, "0.3.")
}

// result answers a task in the shape of the call's version: SendMessage
// (1.0) wraps it as {"task": …}.
func (c rpcCall) result(w http.ResponseWriter, t task) {
	if c.v == v10 && c.op == "send" {
		writeRPC(w, c.req.ID, map[string]any{"task": t}, nil)
		return
	}
	writeRPC(w, c.req.ID, t, nil)
}

// handleRPC is the JSON-RPC binding of a pipeline (or, without {name}, of
// the directory: every task of the caller).
func (s *Server) handleRPC(w http.ResponseWriter, r *http.Request) error {
	pipe, ok := s.pipeline(r)
	if !ok {
		return httpjson.NotFound("NOT_FOUND", "no pipeline "+r.PathValue("name"))
	}
	c, ok := s.readRPC(w, r)
	if !ok {
		return nil
	}
	caller, req, params, v := c.caller, c.req, c.params, c.v
	wrap := func(member string, x any) any {
		if v == v10 {
			x = map[string]any{member: x}
		}
		return rpcResponse{JSONRPC: "2.0", ID: req.ID, Result: x}
	}
	ctx := r.Context()
	switch c.op {
	case "send", "stream":
		var p sendParams
		if err := json.Unmarshal(params, &p); err != nil {
			writeRPC(w, req.ID, nil, errInvalidParams("params: "+err.Error()))
			return nil
		}
		row, err := s.send(ctx, caller, pipe, &p)
		if err != nil {
			writeRPC(w, req.ID, nil, s.asError(err))
			return nil
		}
		if c.op == "stream" {
			s.stream(w, r, v, wrap, row)
			return nil
		}
		if !p.immediate() {
			longLived(w)
			if row, err = s.wait(ctx, row); err != nil {
				if !ctxErr(err) {
					writeRPC(w, req.ID, nil, s.asError(err))
				}
				return nil
			}
		}
		c.result(w, taskOf(v, row, true))
	case "get", "cancel", "subscribe":
		var p struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(params, &p); err != nil || p.ID == "" {
			writeRPC(w, req.ID, nil, errInvalidParams("params.id (the task id) is required"))
			return nil
		}
		var row tracing.MeshRow
		var err error
		if c.op == "cancel" {
			row, err = s.cancel(ctx, caller, pipe, p.ID)
		} else {
			row, err = s.visible(ctx, caller, pipe, p.ID)
		}
		if err != nil {
			writeRPC(w, req.ID, nil, s.asError(err))
			return nil
		}
		if c.op == "subscribe" {
			s.stream(w, r, v, wrap, row)
			return nil
		}
		c.result(w, taskOf(v, row, true))
	case "list":
		var p listParams
		if err := json.Unmarshal(params, &p); err != nil {
			writeRPC(w, req.ID, nil, errInvalidParams("params: "+err.Error()))
			return nil
		}
		res, err := s.listResult(ctx, caller, pipe, p)
		if err != nil {
			writeRPC(w, req.ID, nil, s.asError(err))
			return nil
		}
		writeRPC(w, req.ID, res, nil)
	case "push":
		s.pushRPC(ctx, w, c, pipe)
	default:
		writeRPC(w, req.ID, nil, &a2aError{Code: -32007, Msg: "this agent has no extended card"})
	}
	return nil
}

// listResult is ListTasksResponse.
func (s *Server) listResult(ctx context.Context, caller string, pipe *mesh.Pipeline, p listParams) (map[string]any, error) {
	rows, next, total, err := s.list(ctx, caller, pipe, p)
	if err != nil {
		return nil, err
	}
	withArtifacts := p.IncludeArtifacts == nil || *p.IncludeArtifacts
	tasks := make([]task, len(rows))
	for i, row := range rows {
		tasks[i] = taskOf(v10, row, withArtifacts)
	}
	return map[string]any{"tasks": tasks, "nextPageToken": next, "pageSize": len(tasks), "totalSize": total}, nil
}

// stream answers with the task's event stream.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, v version, wrap func(string, any) any, row tracing.MeshRow) {
	out, err := newStream(w, v, wrap)
	if err != nil {
		httpjson.WriteError(w, http.StatusInternalServerError, "INTERNAL_ERROR", err.Error())
		return
	}
	s.follow(r.Context(), out, row)
	if out.err() != nil && !errors.Is(out.err(), context.Canceled) {
		s.lg.Debug("a2a stream ended", "task", row.ID, "err", out.err())
	}
}
