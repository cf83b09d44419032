package a2a

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// a2aError is an A2A error: its JSON-RPC code, the HTTP status and gRPC
// status name of the HTTP+JSON binding, and a message.
type a2aError struct {
	Code   int
	HTTP   int
	Status string
	Reason string
	Msg    string
}

func (e *a2aError) Error() string { return e.Msg }

// A2A errors (the specification's JSON-RPC codes).
func errTaskNotFound(id string) *a2aError {
	return &a2aError{Code: -32001, HTTP: http.StatusNotFound, Status: "NOT_FOUND", Reason: "TASK_NOT_FOUND", Msg: "task not found: " + id}
}

func errNotCancelable(id string, st tracing.MeshStatus) *a2aError {
	return &a2aError{Code: -32002, HTTP: http.StatusConflict, Status: "FAILED_PRECONDITION", Reason: "TASK_NOT_CANCELABLE",
		Msg: "task " + id + " is " + string(st) + " and cannot be canceled"}
}

func errPushUnsupported() *a2aError {
	return &a2aError{Code: -32003, HTTP: http.StatusBadRequest, Status: "UNIMPLEMENTED", Reason: "PUSH_NOTIFICATION_NOT_SUPPORTED",
		Msg: "push notifications are not supported: stream the task or subscribe to it"}
}

func errUnsupported(msg string) *a2aError {
	return &a2aError{Code: -32004, HTTP: http.StatusBadRequest, Status: "UNIMPLEMENTED", Reason: "UNSUPPORTED_OPERATION", Msg: msg}
}

func errContentType(msg string) *a2aError {
	return &a2aError{Code: -32005, HTTP: http.StatusUnsupportedMediaType, Status: "INVALID_ARGUMENT", Reason: "CONTENT_TYPE_NOT_SUPPORTED", Msg: msg}
}

func errInvalidParams(msg string) *a2aError {
	return &a2aError{Code: -32602, HTTP: http.StatusBadRequest, Status: "INVALID_ARGUMENT", Reason: "INVALID_PARAMS", Msg: msg}
}

func errRateLimited(caller string) *a2aError {
	return &a2aError{Code: -32000, HTTP: http.StatusTooManyRequests, Status: "RESOURCE_EXHAUSTED", Reason: "RATE_LIMITED",
		Msg: "too many tasks from " + caller + "; retry later"}
}

func errInternal() *a2aError {
	return &a2aError{Code: -32603, HTTP: http.StatusInternalServerError, Status: "INTERNAL", Reason: "INTERNAL_ERROR", Msg: "internal error"}
}

// asError maps an engine error to an A2A error: client mistakes keep
// their message, anything else is internal (and logged).
func (s *Server) asError(err error) *a2aError {
	var ae *a2aError
	if errors.As(err, &ae) {
		return ae
	}
	var ie *httpjson.Error
	if errors.As(err, &ie) {
		if ie.Status == http.StatusTooManyRequests {
			return &a2aError{Code: -32000, HTTP: http.StatusTooManyRequests, Status: "RESOURCE_EXHAUSTED", Reason: ie.Code, Msg: ie.Message}
		}
		e := errInvalidParams(ie.Message)
		e.Reason = ie.Code
		if ie.Status == http.StatusForbidden {
			e.HTTP, e.Status = http.StatusForbidden, "PERMISSION_DENIED"
		}
		return e
	}
	s.lg.Error("a2a", "err", err)
	return errInternal()
}

// sendParams is SendMessageRequest (1.0) and MessageSendParams (0.3).
type sendParams struct {
	Message       *message `json:"message"`
	Configuration *struct {
		ReturnImmediately bool        `json:"returnImmediately"`
		Blocking          *bool       `json:"blocking"`
		PushConfig        *pushConfig `json:"pushNotificationConfig"`
		TaskPushConfig    *pushConfig `json:"taskPushNotificationConfig"`
	} `json:"configuration"`
	Metadata json.RawMessage `json:"metadata"`
}

// immediate reports whether the sender does not wait for the task to end.
func (p *sendParams) immediate() bool {
	c := p.Configuration
	return c != nil && (c.ReturnImmediately || (c.Blocking != nil && !*c.Blocking))
}

// payloadOf turns a message into the envelope's first payload: its first
// data part, else its text (a JSON object as is, other text as
// {"text": …}).
func payloadOf(m *message) (json.RawMessage, error) {
	var text strings.Builder
	for _, p := range m.Parts {
		switch {
		case len(p.Data) > 0:
			d := bytes.TrimSpace(p.Data)
			if len(d) == 0 || d[0] != '{' {
				return nil, errInvalidParams("a data part must be a JSON object: it becomes the pipeline's payload")
			}
			return d, nil
		case p.Text != nil:
			text.WriteString(*p.Text)
		case p.Kind == "" || p.Kind == "text" || p.Kind == "data":
			return nil, errInvalidParams("a part must carry text or data")
		default:
			return nil, errContentType("only text and data parts are accepted, not " + p.Kind)
		}
	}
	t := strings.TrimSpace(text.String())
	if strings.HasPrefix(t, "{") && json.Valid([]byte(t)) {
		return json.RawMessage(t), nil
	}
	b, _ := json.Marshal(map[string]string{"text": text.String()})
	return b, nil
}

// visible returns the envelope id if caller created it (through pipe,
// when pipe is set); any other id is "not found".
func (s *Server) visible(ctx context.Context, caller string, pipe *mesh.Pipeline, id string) (tracing.MeshRow, error) {
	row, ok, err := s.cfg.Mesh.Envelope(ctx, id)
	if err != nil {
		return row, err
	}
	if !ok || row.Creator != caller {
		return tracing.MeshRow{}, errTaskNotFound(id)
	}
	if pipe != nil {
		if _, h, err := mesh.Payload(row); err != nil || h[wire.HeaderPipeline] != pipe.Name {
			return tracing.MeshRow{}, errTaskNotFound(id)
		}
	}
	return row, nil
}

// send creates the envelope of a message to pipe; a message naming a task
// that waits for input (a paused envelope) resumes it instead.
func (s *Server) send(ctx context.Context, caller string, pipe *mesh.Pipeline, p *sendParams) (tracing.MeshRow, error) {
	if p.Message == nil {
		return tracing.MeshRow{}, errInvalidParams("message is required")
	}
	push := p.pushConfig()
	if push != nil {
		if e := s.checkPushConfig(push); e != nil {
			return tracing.MeshRow{}, e
		}
	}
	row, err := s.start(ctx, caller, pipe, p)
	if err != nil || push == nil {
		return row, err
	}
	v := v10
	if p.Configuration.TaskPushConfig == nil {
		v = v03
	}
	if err := s.setPush(ctx, caller, row.ID, v, push); err != nil {
		return row, err
	}
	return row, nil
}

// pushConfig is the webhook a send names, nil for none.
func (p *sendParams) pushConfig() *pushConfig {
	if p.Configuration == nil {
		return nil
	}
	return cmp.Or(p.Configuration.TaskPushConfig, p.Configuration.PushConfig)
}

// start creates the envelope of a message to pipe, or resumes the paused
// task it names.
func (s *Server) start(ctx context.Context, caller string, pipe *mesh.Pipeline, p *sendParams) (tracing.MeshRow, error) {
	if p.Message.TaskID != "" {
		row, err := s.visible(ctx, caller, pipe, p.Message.TaskID)
		if err != nil {
			return row, err
		}
		if row.Status != tracing.MeshPaused {
			return row, errUnsupported("task " + row.ID + " is " + string(row.Status) + ": a message continues only a task that waits for input")
		}
		return s.cfg.Mesh.Resume(ctx, row.ID)
	}
	if pipe == nil {
		return tracing.MeshRow{}, errUnsupported("send messages to a pipeline's own endpoint (see the skills of this card)")
	}
	if s.cfg.AllowCreator != nil {
		if ok, _ := s.cfg.AllowCreator(caller); !ok {
			return tracing.MeshRow{}, errRateLimited(caller)
		}
	}
	if err := s.cfg.Mesh.MayStart(caller, pipe.Route); err != nil {
		return tracing.MeshRow{}, err
	}
	payload, err := payloadOf(p.Message)
	if err != nil {
		return tracing.MeshRow{}, err
	}
	if err := pipe.CheckInput(payload); err != nil {
		return tracing.MeshRow{}, errInvalidParams(err.Error())
	}
	headers := map[string]string{wire.HeaderProtocol: "a2a", wire.HeaderPipeline: pipe.Name}
	if c := p.Message.ContextID; c != "" {
		if len(c) > 256 {
			return tracing.MeshRow{}, errInvalidParams("contextId is longer than 256 bytes")
		}
		headers[wire.HeaderA2AContext] = c
	} else {
		headers[wire.HeaderA2AContext] = newID()
	}
	return s.cfg.Mesh.CreateLimited(ctx, mesh.CreateRequest{Creator: caller, Route: pipe.Route, Payload: payload, Headers: headers})
}

// wait follows envelope row until it ends or waits for input.
func (s *Server) wait(ctx context.Context, row tracing.MeshRow) (tracing.MeshRow, error) {
	if settled(row) {
		return row, nil
	}
	return s.cfg.Mesh.Follow(ctx, row.ID, settled)
}

// settled: a blocking send returns at a terminal state or when the task
// waits for input.
func settled(row tracing.MeshRow) bool {
	return row.Status.Terminal() || row.Status == tracing.MeshPaused
}

func (s *Server) cancel(ctx context.Context, caller string, pipe *mesh.Pipeline, id string) (tracing.MeshRow, error) {
	row, err := s.visible(ctx, caller, pipe, id)
	if err != nil {
		return row, err
	}
	if row.Status.Terminal() {
		return row, errNotCancelable(id, row.Status)
	}
	out, err := s.cfg.Mesh.Cancel(ctx, id)
	var ie *httpjson.Error
	if errors.As(err, &ie) && ie.Status == http.StatusConflict {
		return out, errNotCancelable(id, out.Status)
	}
	return out, err
}

// listParams is ListTasksRequest.
type listParams struct {
	ContextID        string `json:"contextId"`
	Status           string `json:"status"`
	PageSize         *int   `json:"pageSize"`
	PageToken        string `json:"pageToken"`
	IncludeArtifacts *bool  `json:"includeArtifacts"`
}

// listWindow bounds how many of the caller's newest envelopes a list looks
// through.
const listWindow = 500

// list returns a page of the caller's tasks (of pipe, when set), newest
// first, with the next page token and the total.
func (s *Server) list(ctx context.Context, caller string, pipe *mesh.Pipeline, p listParams) ([]tracing.MeshRow, string, int, error) {
	size := 50
	if p.PageSize != nil {
		if *p.PageSize < 1 || *p.PageSize > 100 {
			return nil, "", 0, errInvalidParams("pageSize must be from 1 to 100")
		}
		size = *p.PageSize
	}
	offset := 0
	if p.PageToken != "" {
		n, err := strconv.Atoi(p.PageToken)
		if err != nil || n < 0 || n > listWindow {
			return nil, "", 0, errInvalidParams("pageToken is not one this server gave")
		}
		offset = n
	}
	q := tracing.MeshQuery{Creator: caller, Limit: listWindow}
	// "UNRECOGNIZED" is what @a2a-js/sdk sends for "no filter".
	if p.Status != "" && p.Status != "TASK_STATE_UNSPECIFIED" && p.Status != "UNRECOGNIZED" {
		st, ok := statusOf(p.Status)
		if !ok {
			return nil, "", 0, errInvalidParams("unknown task state " + p.Status)
		}
		q.Statuses = st
	}
	rows, _, err := s.cfg.Mesh.Envelopes(ctx, q)
	if err != nil {
		return nil, "", 0, err
	}
	var kept []tracing.MeshRow
	for _, row := range rows {
		_, h, err := mesh.Payload(row)
		if err != nil || h[wire.HeaderProtocol] != "a2a" || (pipe != nil && h[wire.HeaderPipeline] != pipe.Name) ||
			(p.ContextID != "" && contextOf(row, h) != p.ContextID) {
			continue
		}
		kept = append(kept, row)
	}
	total := len(kept)
	if offset > total {
		offset = total
	}
	end := min(offset+size, total)
	next := ""
	if end < total {
		next = strconv.Itoa(end)
	}
	return kept[offset:end], next, total, nil
}
