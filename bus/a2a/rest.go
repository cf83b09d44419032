package a2a

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// The HTTP+JSON binding of protocol 1.0: POST {agent}/message:send and
// message:stream, GET {agent}/tasks and tasks/{id}, POST tasks/{id}:cancel
// and tasks/{id}:subscribe. Errors are google.rpc.Status objects.

func restError(w http.ResponseWriter, e *a2aError) {
	httpjson.Write(w, e.HTTP, map[string]any{"error": map[string]any{
		"code": e.HTTP, "status": e.Status, "message": e.Msg,
		"details": []map[string]any{{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": e.Reason, "domain": "a2a-protocol.org"}},
	}})
}

// restCaller resolves the pipeline and the caller of a REST request; it
// has answered when ok is false.
func (s *Server) restCaller(w http.ResponseWriter, r *http.Request) (string, bool) {
	if _, ok := s.pipeline(r); !ok {
		restError(w, &a2aError{HTTP: http.StatusNotFound, Status: "NOT_FOUND", Reason: "NOT_FOUND", Msg: "no pipeline " + r.PathValue("name")})
		return "", false
	}
	caller, err := s.caller(r)
	if err != nil {
		mesh.Unauthorized(w, err)
		return "", false
	}
	return caller, true
}

func (s *Server) readSend(w http.ResponseWriter, r *http.Request) (*sendParams, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		restError(w, &a2aError{HTTP: http.StatusRequestEntityTooLarge, Status: "INVALID_ARGUMENT", Reason: "PAYLOAD_TOO_LARGE", Msg: "the request body is unreadable or too large"})
		return nil, false
	}
	var p sendParams
	if err := json.Unmarshal(body, &p); err != nil {
		restError(w, errInvalidParams("the body is not a SendMessageRequest: "+err.Error()))
		return nil, false
	}
	return &p, true
}

// restSend creates the task of a REST send; it has answered when ok is
// false.
func (s *Server) restSend(w http.ResponseWriter, r *http.Request) (tracing.MeshRow, *sendParams, bool) {
	caller, ok := s.restCaller(w, r)
	if !ok {
		return tracing.MeshRow{}, nil, false
	}
	p, ok := s.readSend(w, r)
	if !ok {
		return tracing.MeshRow{}, nil, false
	}
	pipe, _ := s.pipeline(r)
	row, err := s.send(r.Context(), caller, pipe, p)
	if err != nil {
		restError(w, s.asError(err))
		return row, p, false
	}
	return row, p, true
}

func (s *Server) handleRESTSend(w http.ResponseWriter, r *http.Request) {
	row, p, ok := s.restSend(w, r)
	if !ok {
		return
	}
	var err error
	if !p.immediate() {
		longLived(w)
		if row, err = s.wait(r.Context(), row); err != nil {
			if !ctxErr(err) {
				restError(w, s.asError(err))
			}
			return
		}
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"task": taskOf(v10, row, true)})
}

func restWrap(member string, x any) any { return map[string]any{member: x} }

func (s *Server) handleRESTStream(w http.ResponseWriter, r *http.Request) {
	if row, _, ok := s.restSend(w, r); ok {
		s.stream(w, r, v10, restWrap, row)
	}
}

func (s *Server) handleRESTList(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.restCaller(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	p := listParams{ContextID: q.Get("contextId"), Status: q.Get("status"), PageToken: q.Get("pageToken")}
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			restError(w, errInvalidParams("pageSize must be an integer"))
			return
		}
		p.PageSize = &n
	}
	if v := q.Get("includeArtifacts"); v != "" {
		b := v == "true"
		p.IncludeArtifacts = &b
	}
	pipe, _ := s.pipeline(r)
	res, err := s.listResult(r.Context(), caller, pipe, p)
	if err != nil {
		restError(w, s.asError(err))
		return
	}
	httpjson.Write(w, http.StatusOK, res)
}

// handleRESTTask serves GET tasks/{id}, POST tasks/{id}:cancel and
// tasks/{id}:subscribe.
func (s *Server) handleRESTTask(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.restCaller(w, r)
	if !ok {
		return
	}
	id, action, _ := strings.Cut(r.PathValue("task"), ":")
	pipe, _ := s.pipeline(r)
	var row tracing.MeshRow
	var err error
	switch {
	case r.Method == http.MethodGet && action == "":
		row, err = s.visible(r.Context(), caller, pipe, id)
	case r.Method == http.MethodPost && action == "cancel":
		row, err = s.cancel(r.Context(), caller, pipe, id)
	case action == "subscribe":
		if row, err = s.visible(r.Context(), caller, pipe, id); err == nil {
			s.stream(w, r, v10, restWrap, row)
			return
		}
	default:
		restError(w, &a2aError{HTTP: http.StatusNotFound, Status: "NOT_FOUND", Reason: "NOT_FOUND", Msg: "no such operation on a task: " + r.Method + " " + r.URL.Path})
		return
	}
	if err != nil {
		restError(w, s.asError(err))
		return
	}
	httpjson.Write(w, http.StatusOK, taskOf(v10, row, true))
}
