package a2a

import (
	"encoding/json"
	"time"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/tracing"
)

// version is the protocol version a request speaks; it decides the JSON
// shapes of the answer.
type version int

const (
	v10 version = iota
	v03
)

// Task states of protocol 1.0 (v03: the lowercase names).
var states = map[tracing.MeshStatus][2]string{
	tracing.MeshPending:   {"TASK_STATE_SUBMITTED", "submitted"},
	tracing.MeshRunning:   {"TASK_STATE_WORKING", "working"},
	tracing.MeshRetrying:  {"TASK_STATE_WORKING", "working"},
	tracing.MeshPaused:    {"TASK_STATE_INPUT_REQUIRED", "input-required"},
	tracing.MeshSucceeded: {"TASK_STATE_COMPLETED", "completed"},
	tracing.MeshFailed:    {"TASK_STATE_FAILED", "failed"},
	tracing.MeshCanceled:  {"TASK_STATE_CANCELED", "canceled"},
}

// state maps an envelope status to a task state; unknown statuses are
// TASK_STATE_UNSPECIFIED ("unknown" in 0.3).
func (v version) state(s tracing.MeshStatus) string {
	if st, ok := states[s]; ok {
		return st[v]
	}
	if v == v03 {
		return "unknown"
	}
	return "TASK_STATE_UNSPECIFIED"
}

// statusOf maps a task state filter back to envelope statuses ("unknown"
// and TASK_STATE_UNSPECIFIED are not filters: see list).
func statusOf(state string) ([]tracing.MeshStatus, bool) {
	var out []tracing.MeshStatus
	for _, s := range tracing.MeshStatuses {
		if names, ok := states[s]; ok && (names[0] == state || names[1] == state) {
			out = append(out, s)
		}
	}
	return out, len(out) > 0
}

func (v version) kind(k string) string {
	if v == v03 {
		return k
	}
	return ""
}

func (v version) role(agent bool) string {
	switch {
	case v == v03 && agent:
		return "agent"
	case v == v03:
		return "user"
	case agent:
		return "ROLE_AGENT"
	default:
		return "ROLE_USER"
	}
}

// part is one part of a message or artifact (text or data).
type part struct {
	Kind string          `json:"kind,omitempty"`
	Text *string         `json:"text,omitempty"`
	Data json.RawMessage `json:"data,omitempty"`
}

type message struct {
	Kind      string          `json:"kind,omitempty"`
	MessageID string          `json:"messageId"`
	ContextID string          `json:"contextId,omitempty"`
	TaskID    string          `json:"taskId,omitempty"`
	Role      string          `json:"role"`
	Parts     []part          `json:"parts"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
}

type taskStatus struct {
	State     string   `json:"state"`
	Message   *message `json:"message,omitempty"`
	Timestamp string   `json:"timestamp,omitempty"`
}

type artifact struct {
	ArtifactID  string `json:"artifactId"`
	Name        string `json:"name,omitempty"`
	Description string `json:"description,omitempty"`
	Parts       []part `json:"parts"`
}

type task struct {
	Kind      string         `json:"kind,omitempty"`
	ID        string         `json:"id"`
	ContextID string         `json:"contextId"`
	Status    taskStatus     `json:"status"`
	Artifacts []artifact     `json:"artifacts,omitempty"`
	Metadata  map[string]any `json:"metadata,omitempty"`
}

type statusUpdate struct {
	Kind      string         `json:"kind,omitempty"`
	TaskID    string         `json:"taskId"`
	ContextID string         `json:"contextId"`
	Status    taskStatus     `json:"status"`
	Final     *bool          `json:"final,omitempty"`
	Metadata  map[string]any `json:"metadata,omitempty"`
}

type artifactUpdate struct {
	Kind      string   `json:"kind,omitempty"`
	TaskID    string   `json:"taskId"`
	ContextID string   `json:"contextId"`
	Artifact  artifact `json:"artifact"`
	Append    bool     `json:"append,omitempty"`
	LastChunk bool     `json:"lastChunk,omitempty"`
}

// Artifact ids: the final payload, and the partial (FLY) output streamed
// while the envelope runs.
const (
	resultArtifact  = "result"
	partialArtifact = "partial"
)

// contextOf is the task's context id: the one the message named, else the
// envelope id.
func contextOf(row tracing.MeshRow, headers map[string]string) string {
	if c := headers[wire.HeaderA2AContext]; c != "" {
		return c
	}
	return row.ID
}

func textPart(v version, s string) part { return part{Kind: v.kind("text"), Text: &s} }

func dataPart(v version, d json.RawMessage) part { return part{Kind: v.kind("data"), Data: d} }

// resultOf is the final payload's artifact.
func resultOf(v version, payload json.RawMessage) artifact {
	return artifact{ArtifactID: resultArtifact, Name: "result", Description: "the envelope's final payload",
		Parts: []part{dataPart(v, payload)}}
}

// statusOfRow is the task status of an envelope's row: failed and
// canceled tasks carry the reason as an agent message.
func statusOfRow(v version, row tracing.MeshRow, ctxID string) taskStatus {
	st := taskStatus{State: v.state(row.Status), Timestamp: time.UnixMicro(row.UpdatedAt).UTC().Format(time.RFC3339Nano)}
	if row.Status == tracing.MeshFailed || row.Status == tracing.MeshCanceled {
		text := row.Reason
		if row.Error != "" {
			text += ": " + row.Error
		}
		if text != "" {
			st.Message = &message{Kind: v.kind("message"), MessageID: row.ID + "-status", ContextID: ctxID, TaskID: row.ID,
				Role: v.role(true), Parts: []part{textPart(v, text)}}
		}
	}
	return st
}

// metadataOf is what the task's metadata tells of the envelope.
func metadataOf(row tracing.MeshRow, headers map[string]string) map[string]any {
	m := map[string]any{"envelopeStatus": string(row.Status), "progress": row.Progress, "hop": row.Hop}
	if p := headers[wire.HeaderPipeline]; p != "" {
		m["pipeline"] = p
	}
	if row.Actor != "" {
		m["actor"] = row.Actor
	}
	if row.Reason != "" {
		m["reason"] = row.Reason
	}
	return map[string]any{"beam": m}
}

// taskOf is the task an envelope's row is.
func taskOf(v version, row tracing.MeshRow, withArtifacts bool) task {
	payload, headers, _ := mesh.Payload(row)
	ctxID := contextOf(row, headers)
	t := task{Kind: v.kind("task"), ID: row.ID, ContextID: ctxID, Status: statusOfRow(v, row, ctxID),
		Metadata: metadataOf(row, headers)}
	if withArtifacts && row.Status == tracing.MeshSucceeded && len(payload) > 0 {
		t.Artifacts = []artifact{resultOf(v, payload)}
	}
	return t
}
