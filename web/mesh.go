package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// The pipeline view: envelopes of bus/mesh read from the beam_mesh
// projection and their log traces; requeue of dead envelopes goes through
// Config.MeshRequeue.

// meshRoutes mounts the pipeline endpoints on obs.
func (d *Dashboard) meshRoutes(obs func(pattern string, admin bool, h handlerFunc)) {
	obs("GET /observability/mesh", false, d.handleMeshList)
	obs("GET /observability/mesh/{id}", false, d.handleMeshEnvelope)
	obs("POST /observability/mesh/{id}/requeue", true, d.handleMeshRequeue)
}

// meshHop is one hop of an envelope's timeline, folded from its trace.
type meshHop struct {
	Actor    string          `json:"actor"`
	Attempts int             `json:"attempts"`
	Outcome  string          `json:"outcome"`
	Error    string          `json:"error,omitempty"`
	Progress float64         `json:"progress"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	// At is when the hop was first dispatched; EndedAt when it finished
	// (absent while it runs).
	At      time.Time  `json:"at"`
	EndedAt *time.Time `json:"endedAt,omitempty"`
}

func (d *Dashboard) handleMeshList(w http.ResponseWriter, r *http.Request, p principal) error {
	q := r.URL.Query()
	limit, err := intParam(q, "limit", defaultListLimit, 1, maxListLimit)
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
	}
	mq := tracing.MeshQuery{Limit: limit, Sump: q.Get("dead") == "1", ParentID: q.Get("parent")}
	if s := q.Get("status"); s != "" {
		st := tracing.MeshStatus(s)
		if st.Order() < 0 {
			return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", "unknown status "+s)
		}
		mq.Statuses = []tracing.MeshStatus{st}
	}
	rows, total, err := d.log.MeshEnvelopes(r.Context(), mq)
	if err != nil {
		return httpjson.Internal("list envelopes failed", err)
	}
	if rows == nil {
		rows = []tracing.MeshRow{}
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"envelopes": rows, "total": total,
		"requeue": map[string]any{"allowed": p.role == roleAdmin && d.cfg.MeshRequeue != nil}})
	return nil
}

func (d *Dashboard) handleMeshEnvelope(w http.ResponseWriter, r *http.Request, p principal) error {
	ctx := r.Context()
	// The row and the hops describe the same point of the log.
	row, trace, ok, err := d.log.MeshEnvelopeTrace(ctx, r.PathValue("id"))
	if err != nil {
		return httpjson.Internal("read envelope failed", err)
	}
	if !ok {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no envelope "+r.PathValue("id"))
	}
	children, _, err := d.log.MeshEnvelopes(ctx, tracing.MeshQuery{ParentID: row.ID, Limit: maxListLimit})
	if err != nil {
		return httpjson.Internal("read fan-out children failed", err)
	}
	if children == nil {
		children = []tracing.MeshRow{}
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"envelope": row, "hops": meshHops(trace), "children": children,
		"requeue": map[string]any{"allowed": p.role == roleAdmin && d.cfg.MeshRequeue != nil && row.Sump}})
	return nil
}

// meshHops folds an envelope's trace into its hops: attempts per actor,
// the outcome and the payload each hop produced.
func meshHops(trace []tracing.Event) []meshHop {
	hops := []meshHop{}
	var cur *meshHop
	for _, ev := range trace {
		st, err := tracing.DecodeMeshStep(ev.Details.Mesh)
		if err != nil || st.Kind == "" {
			continue
		}
		switch st.Kind {
		case tracing.MeshKindDispatch:
			if cur == nil || cur.Actor != st.Actor || cur.Outcome != "running" {
				hops = append(hops, meshHop{Actor: st.Actor, Outcome: "running", At: ev.At})
				cur = &hops[len(hops)-1]
			}
			cur.Attempts = max(cur.Attempts, st.Attempt)
		case tracing.MeshKindRetry:
			if cur != nil {
				cur.Error = st.Error
			}
		case tracing.MeshKindHop, tracing.MeshKindSink, tracing.MeshKindFailed, tracing.MeshKindCancel:
			if cur != nil && cur.Outcome == "running" {
				cur.Outcome = map[string]string{tracing.MeshKindHop: "done", tracing.MeshKindSink: "done",
					tracing.MeshKindFailed: "failed", tracing.MeshKindCancel: "canceled"}[st.Kind]
				if st.Error != "" {
					cur.Error = st.Error
				}
				cur.Progress = st.Progress
				end := ev.At
				cur.EndedAt = &end
				var env struct {
					Payload json.RawMessage `json:"payload"`
				}
				if json.Unmarshal(st.Envelope, &env) == nil {
					cur.Payload = env.Payload
				}
			}
		}
	}
	return hops
}

func (d *Dashboard) handleMeshRequeue(w http.ResponseWriter, r *http.Request, p principal) error {
	if d.cfg.MeshRequeue == nil {
		return httpjson.New(http.StatusNotImplemented, "REQUEUE_UNAVAILABLE", "pipelines are not running in this directory")
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	id, err := d.cfg.MeshRequeue(ctx, r.PathValue("id"))
	if err != nil {
		// The pipeline's refusals (no such envelope, not a dead letter)
		// are *httpjson.Error; the adapter answers them as they are.
		var refused *httpjson.Error
		if errors.As(err, &refused) {
			return refused
		}
		return httpjson.Internal("requeue envelope failed", err)
	}
	httpjson.Write(w, http.StatusCreated, map[string]any{"id": id})
	return nil
}
