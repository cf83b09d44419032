package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// intentView is one intent row (tracing.IntentRow) as the dashboard serves it.
type intentView struct {
	Nonce              string          `json:"nonce"`
	From               string          `json:"from"`
	To                 string          `json:"to"`
	IntentType         string          `json:"intentType"`
	Status             tracing.State   `json:"status"`
	Bucket             tracing.Bucket  `json:"bucket"`
	Owner              tracing.Owner   `json:"owner"`
	Transport          string          `json:"transport,omitempty"`
	Attempt            int             `json:"attempt,omitempty"`
	ErrorCode          string          `json:"errorCode,omitempty"`
	RequestedAt        string          `json:"requestedAt"`
	Timestamp          string          `json:"timestamp,omitempty"`
	CompletedAt        *string         `json:"completedAt"`
	RoundTripLatencyMs *int64          `json:"roundTripLatencyMs"`
	TimeoutMs          int64           `json:"timeoutMs,omitempty"`
	UpdatedAt          string          `json:"updatedAt"`
	LastSeq            int64           `json:"lastSeq"`
	Result             json.RawMessage `json:"result,omitempty"`
}

func viewOf(r *tracing.IntentRow, withResult bool) intentView {
	v := intentView{
		Nonce: r.Nonce, From: r.From, To: r.To, IntentType: r.IntentType,
		Status: r.Status, Bucket: r.Status.Bucket(), Owner: r.Owner,
		Transport: r.Transport, Attempt: r.Attempt, ErrorCode: r.ErrorCode,
		RequestedAt: isoMicros(r.RequestedAt), Timestamp: r.ClientTimestamp,
		CompletedAt: isoPtr(r.CompletedAt), RoundTripLatencyMs: r.RoundTripLatencyMs,
		TimeoutMs: r.TimeoutMs, UpdatedAt: isoMicros(r.UpdatedAt), LastSeq: r.LastSeq,
	}
	if withResult && len(r.ResultJSON) > 0 && json.Valid(r.ResultJSON) {
		v.Result = json.RawMessage(r.ResultJSON)
	}
	return v
}

// intentFilter is the parsed query of GET /observability/intents.
type intentFilter struct {
	q      tracing.IntentQuery
	limit  int
	offset int
}

func parseIntentFilter(q url.Values, now time.Time) (*intentFilter, error) {
	f := &intentFilter{}
	var err error
	for _, p := range []struct {
		name string
		dst  *string
	}{{"q", &f.q.Search}, {"from", &f.q.From}, {"to", &f.q.To}, {"intentType", &f.q.IntentType},
		{"errorCode", &f.q.ErrorCode}, {"nonce", &f.q.Nonce}, {"beamId", &f.q.Party}} {
		if *p.dst, err = param(q, p.name); err != nil {
			return nil, err
		}
	}
	if f.q.Statuses, err = statesParam(q, "status"); err != nil {
		return nil, err
	}
	since, hasSince, err := timeParam(q, "since")
	if err != nil {
		return nil, err
	}
	if q.Get("hours") != "" {
		h, err := hoursParam(q, defaultWindowHours)
		if err != nil {
			return nil, err
		}
		hs := now.Add(-time.Duration(h * float64(time.Hour)))
		if !hasSince || hs.After(since) {
			since, hasSince = hs, true
		}
	}
	if hasSince {
		f.q.Since = since
	}
	if until, ok, err := timeParam(q, "until"); err != nil {
		return nil, err
	} else if ok {
		f.q.Until = until
	}
	if f.limit, err = intParam(q, "limit", defaultListLimit, 1, maxListLimit); err != nil {
		return nil, err
	}
	if f.offset, err = intParam(q, "offset", 0, 0, maxOffset); err != nil {
		return nil, err
	}
	f.q.Limit, f.q.Offset = f.limit, f.offset
	return f, nil
}

type intentsResponse struct {
	Intents []intentView `json:"intents"`
	Total   int64        `json:"total"`
	Limit   int          `json:"limit"`
	Offset  int          `json:"offset"`
	// LastSeq is the log position read before the query: a stream started
	// after it misses nothing the list does not show.
	LastSeq int64 `json:"lastSeq"`
}

func (d *Dashboard) handleIntents(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := parseIntentFilter(r.URL.Query(), d.clock())
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
	}
	resp := intentsResponse{Intents: []intentView{}, Limit: f.limit, Offset: f.offset, LastSeq: d.log.LastSeq()}
	ctx := r.Context()
	if resp.Total, err = d.log.CountIntents(ctx, f.q); err != nil {
		return httpjson.Internal("list intents failed", err)
	}
	rows, err := d.log.Intents(ctx, f.q)
	if err != nil {
		return httpjson.Internal("list intents failed", err)
	}
	for i := range rows {
		resp.Intents = append(resp.Intents, viewOf(&rows[i], false))
	}
	httpjson.Write(w, http.StatusOK, resp)
	return nil
}

// stageView is one lifecycle event in a trace.
type stageView struct {
	Seq          int64           `json:"seq"`
	Index        int             `json:"index"`
	State        tracing.State   `json:"state"`
	Bucket       tracing.Bucket  `json:"bucket"`
	At           string          `json:"at"`
	DeltaMs      float64         `json:"deltaMs"`
	SinceStartMs float64         `json:"sinceStartMs"`
	Transport    string          `json:"transport,omitempty"`
	Attempt      int             `json:"attempt,omitempty"`
	Annotation   bool            `json:"annotation,omitempty"`
	Details      json.RawMessage `json:"details"`
}

// traceLink points at a related trace, such as the peer directory's side of
// a federated intent.
type traceLink struct {
	Rel      string `json:"rel"`
	Peer     string `json:"peer,omitempty"`
	Nonce    string `json:"nonce"`
	HopCount any    `json:"hopCount,omitempty"`
	Seq      int64  `json:"seq"`
	Href     string `json:"href,omitempty"`
}

type traceResponse struct {
	Intent  intentView         `json:"intent"`
	Stages  []stageView        `json:"stages"`
	Request json.RawMessage    `json:"request"`
	Result  json.RawMessage    `json:"result"`
	Links   []traceLink        `json:"links"`
	Message *deadLetterSummary `json:"message,omitempty"`
}

func (d *Dashboard) handleTrace(w http.ResponseWriter, r *http.Request, _ principal) error {
	nonce := r.PathValue("nonce")
	if nonce == "" || len(nonce) > tracing.MaxNonceBytes {
		return httpjson.New(http.StatusBadRequest, "INVALID_NONCE", "the nonce is empty or too long")
	}
	resp, err := d.trace(r.Context(), nonce)
	if errors.Is(err, errNotFound) {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no intent with nonce "+nonce)
	}
	if err != nil {
		return httpjson.Internal("read trace failed", err)
	}
	httpjson.Write(w, http.StatusOK, resp)
	return nil
}

// handleEvents answers GET /observability/events/{nonce}: the events of one
// nonce (an intent's, "job:<id>" or "mesh:<id>") exactly as the log holds
// them, details included, so that beam trace --url prints what beam trace
// --data-dir prints.
func (d *Dashboard) handleEvents(w http.ResponseWriter, r *http.Request, _ principal) error {
	nonce := r.PathValue("nonce")
	if nonce == "" || len(nonce) > tracing.MaxNonceBytes {
		return httpjson.New(http.StatusBadRequest, "INVALID_NONCE", "the nonce is empty or too long")
	}
	events, err := d.log.Trace(r.Context(), nonce)
	if err != nil {
		return httpjson.Internal("read trace failed", err)
	}
	if len(events) == 0 {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no events for nonce "+nonce)
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"nonce": nonce, "events": events})
	return nil
}

var errNotFound = errors.New("not found")

func (d *Dashboard) trace(ctx context.Context, nonce string) (*traceResponse, error) {
	row, ok, err := d.log.Intent(ctx, nonce)
	if err != nil {
		return nil, err
	}
	events, err := d.log.Trace(ctx, nonce)
	if err != nil {
		return nil, err
	}
	if !ok && len(events) == 0 {
		return nil, errNotFound
	}
	if !ok {
		for _, ev := range events {
			row.Apply(ev)
		}
	}
	resp := &traceResponse{Intent: viewOf(&row, true), Stages: make([]stageView, 0, len(events)), Links: []traceLink{}}
	var prev, start time.Time
	var prevState tracing.State
	for i, ev := range events {
		if i == 0 {
			start, prev = ev.At, ev.At
		}
		det := ev.Details
		if len(det.Frame) > 0 && resp.Request == nil && json.Valid(det.Frame) {
			resp.Request = det.Frame
		}
		if len(det.Result) > 0 && json.Valid(det.Result) {
			resp.Result = det.Result
		}
		det.Frame, det.Result = nil, nil
		raw, err := json.Marshal(det)
		if err != nil {
			return nil, fmt.Errorf("encode details of event %d: %w", ev.Seq, err)
		}
		resp.Stages = append(resp.Stages, stageView{
			Seq: ev.Seq, Index: i + 1, State: ev.State, Bucket: ev.State.Bucket(), At: isoTime(ev.At),
			DeltaMs:      float64(ev.At.Sub(prev).Microseconds()) / 1000,
			SinceStartMs: float64(ev.At.Sub(start).Microseconds()) / 1000,
			Transport:    ev.Transport, Attempt: ev.Attempt,
			Annotation: i > 0 && ev.State == prevState,
			Details:    raw,
		})
		prev, prevState = ev.At, ev.State
		if l, ok := peerLink(ev); ok && !hasLink(resp.Links, l) {
			resp.Links = append(resp.Links, l)
		}
	}
	if len(row.ResultJSON) > 0 && json.Valid(row.ResultJSON) {
		resp.Result = json.RawMessage(row.ResultJSON)
	}
	if m, ok, err := d.log.Message(ctx, nonce); err != nil {
		return nil, err
	} else if ok {
		s := summaryOf(&m)
		resp.Message = &s
	}
	return resp, nil
}

// peerKeys are the detail keys that name the other directory of a
// federation hop.
var peerKeys = []string{"peer", "peerDirectory", "peerUrl", "peerDirectoryUrl", "sourceDirectory", "targetDirectory"}

// hasLink reports whether links already point at l's peer trace (every
// event of a hop names the peer; the trace shows the hop once).
func hasLink(links []traceLink, l traceLink) bool {
	for _, x := range links {
		if x.Peer == l.Peer && x.Nonce == l.Nonce {
			return true
		}
	}
	return false
}

func peerLink(ev tracing.Event) (traceLink, bool) {
	var peer string
	for _, k := range peerKeys {
		if s, ok := ev.Details.Extra[k].(string); ok && s != "" {
			peer = s
			break
		}
	}
	if peer == "" {
		return traceLink{}, false
	}
	hop := ev.Details.Extra["hopCount"]
	if hop == nil {
		hop = ev.Details.Extra["hop"]
	}
	l := traceLink{Rel: "peer-trace", Peer: peer, Nonce: ev.Nonce, Seq: ev.Seq, HopCount: hop}
	if n, ok := ev.Details.Extra["peerNonce"].(string); ok && n != "" {
		l.Nonce = n
	}
	if u, err := url.Parse(peer); err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" {
		l.Href = strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/") + "/dashboard/#/intents/" + url.PathEscape(l.Nonce)
	}
	return l, true
}
