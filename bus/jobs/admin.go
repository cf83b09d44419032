package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Counts returns the number of jobs by namespace and status.
func (s *Service) Counts() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]map[string]int, len(s.counts))
	for ns, m := range s.counts {
		c := make(map[string]int, len(m))
		for st, n := range m {
			c[st] = n
		}
		out[ns] = c
	}
	return out
}

// Recent returns up to n jobs, newest first (by last change); only dead
// ones, newest death first, if deadOnly. Rows are copies without payload.
func (s *Service) Recent(n int, deadOnly bool) []tracing.JobRow {
	if n <= 0 {
		return nil
	}
	key := func(r *tracing.JobRow) int64 { return r.LastSeq }
	if deadOnly {
		key = func(r *tracing.JobRow) int64 { return r.DeadAt }
	}
	// A bounded min-heap by key keeps the n newest without copying all.
	h := make([]*job, 0, n)
	less := func(a, b *job) bool {
		ka, kb := key(&a.row), key(&b.row)
		return ka < kb || ka == kb && a.row.ID > b.row.ID
	}
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			m := l
			if r := l + 1; r < len(h) && less(h[r], h[l]) {
				m = r
			}
			if !less(h[m], h[i]) {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	push := func(j *job) {
		if len(h) < n {
			h = append(h, j)
			for i := len(h) - 1; i > 0; {
				p := (i - 1) / 2
				if !less(h[i], h[p]) {
					break
				}
				h[i], h[p] = h[p], h[i]
				i = p
			}
			return
		}
		if less(h[0], j) {
			h[0] = j
			down(0)
		}
	}
	s.mu.Lock()
	src := s.jobs
	if deadOnly {
		src = s.dead
	}
	for _, j := range src {
		push(j)
	}
	rows := make([]tracing.JobRow, len(h))
	for i, j := range h {
		rows[i] = j.row
		rows[i].Payload, rows[i].Result = nil, nil
	}
	s.mu.Unlock()
	slices.SortFunc(rows, func(a, b tracing.JobRow) int {
		return cmp.Or(cmp.Compare(key(&b), key(&a)), cmp.Compare(a.ID, b.ID))
	})
	return rows
}

// Cancel and Retry are the admin operations, for the web dashboard. They
// return the new status.
func (s *Service) Cancel(ctx context.Context, id string) (string, error) {
	return s.adminMove(ctx, id, OpCancel)
}

// Retry moves a dead job back to open with its attempts reset.
func (s *Service) Retry(ctx context.Context, id string) (string, error) {
	return s.adminMove(ctx, id, OpRetry)
}

func (s *Service) testerKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func (s *Service) handleMetrics(w http.ResponseWriter, _ *http.Request, _ *call) *httpjson.Error {
	counts := s.Counts()
	var b strings.Builder
	b.WriteString("# HELP intent_bus_intents_total Total intents by status and namespace\n# TYPE intent_bus_intents_total gauge\n")
	nss := make([]string, 0, len(counts))
	for ns := range counts {
		nss = append(nss, ns)
	}
	slices.Sort(nss)
	dead := 0
	for _, ns := range nss {
		for _, st := range []string{tracing.JobOpen, tracing.JobClaimed, tracing.JobFulfilled, tracing.JobDead} {
			fmt.Fprintf(&b, "intent_bus_intents_total{status=%q,namespace=%q} %d\n", st, ns, counts[ns][st])
		}
		dead += counts[ns][tracing.JobDead]
	}
	fmt.Fprintf(&b, "# HELP intent_bus_dead_letters_total Total dead-letter intents\n# TYPE intent_bus_dead_letters_total gauge\nintent_bus_dead_letters_total %d\n", dead)
	fmt.Fprintf(&b, "# HELP intent_bus_tester_keys_total Total active tester keys\n# TYPE intent_bus_tester_keys_total gauge\nintent_bus_tester_keys_total %d\n", s.testerKeys())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(b.String()))
	return nil
}

var dashboardTmpl = template.Must(template.New("d").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Intent Bus</title>
<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}</style>
</head><body><h1>Intent Bus (protocol 2.1)</h1>
<h2>Queues</h2><table><tr><th>namespace</th><th>open</th><th>claimed</th><th>fulfilled</th><th>dead</th></tr>
{{range .Queues}}<tr><td>{{.NS}}</td><td>{{.Open}}</td><td>{{.Claimed}}</td><td>{{.Fulfilled}}</td><td>{{.Dead}}</td></tr>{{end}}</table>
<p>Tester keys: {{.Keys}}</p>
<h2>Recent intents</h2><table><tr><th>id</th><th>namespace</th><th>goal</th><th>status</th><th>priority</th><th>attempts</th></tr>
{{range .Recent}}<tr><td>{{.ID}}</td><td>{{.Namespace}}</td><td>{{.Goal}}</td><td>{{.Status}}</td><td>{{.Priority}}</td><td>{{.ClaimAttempts}}</td></tr>{{end}}</table>
<h2>Dead letters</h2><table><tr><th>id</th><th>namespace</th><th>goal</th><th>attempts</th><th>reason</th></tr>
{{range .Dead}}<tr><td>{{.ID}}</td><td>{{.Namespace}}</td><td>{{.Goal}}</td><td>{{.ClaimAttempts}}</td><td>{{.DeadReason}}</td></tr>{{end}}</table>
</body></html>`))

type queueLine struct {
	NS                             string
	Open, Claimed, Fulfilled, Dead int
}

func (s *Service) handleDashboard(w http.ResponseWriter, _ *http.Request, _ *call) *httpjson.Error {
	counts := s.Counts()
	var qs []queueLine
	for ns, m := range counts {
		qs = append(qs, queueLine{NS: ns, Open: m[tracing.JobOpen], Claimed: m[tracing.JobClaimed],
			Fulfilled: m[tracing.JobFulfilled], Dead: m[tracing.JobDead]})
	}
	slices.SortFunc(qs, func(a, b queueLine) int { return strings.Compare(a.NS, b.NS) })
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.WriteHeader(http.StatusOK)
	_ = dashboardTmpl.Execute(w, map[string]any{"Queues": qs, "Keys": s.testerKeys(),
		"Recent": s.Recent(50, false), "Dead": s.Recent(100, true)})
	return nil
}

func (s *Service) handleGenerateKey(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	owner, ok, e := c.f.str("owner")
	if e != nil {
		return e
	}
	if !ok || owner == "" || len([]rune(owner)) > 128 {
		return invalid("owner", "owner must be a string of 1 to 128 characters.")
	}
	raw, err := s.newID(24)
	if err != nil {
		return s.internal(err)
	}
	key := "tk_" + raw
	h := hashHex(key)
	now := s.clock()
	if _, err := s.log.DoOps(r.Context(), []tracing.Op{op(opKeyAdd, tableOp{Hash: h, Owner: owner, At: msToSecs(now.UnixMilli())})}); err != nil {
		return s.internal(err)
	}
	s.mu.Lock()
	s.keys[h] = owner
	s.mu.Unlock()
	reply(w, http.StatusCreated, map[string]any{"api_key": key, "owner": owner})
	return nil
}

func (s *Service) handleRevokeKey(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	key, ok, e := c.f.str("api_key")
	if e != nil {
		return e
	}
	if !ok || key == "" {
		return httpjson.New(http.StatusBadRequest, "invalid_request", "Missing api_key.")
	}
	h := hashHex(key)
	s.mu.Lock()
	_, exists := s.keys[h]
	s.mu.Unlock()
	if !exists {
		return httpjson.New(http.StatusNotFound, "not_found", "Key not found.")
	}
	d := h[:32]
	if _, err := s.log.DoOps(r.Context(), []tracing.Op{op(opKeyRevoke, tableOp{Hash: h, Digest: d})}); err != nil {
		return s.internal(err)
	}
	s.mu.Lock()
	delete(s.keys, h)
	delete(s.rates, d)
	for k := range s.idem {
		if strings.HasPrefix(k, d+"\x00") {
			delete(s.idem, k)
		}
	}
	s.mu.Unlock()
	s.nonces.Sweep(time.Time{}, func(k string) bool { return strings.HasPrefix(k, d+"\x00") })
	reply(w, http.StatusOK, map[string]any{"ok": true})
	return nil
}

func (s *Service) handlePurge(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	if string(c.f["confirm"]) != "true" {
		return httpjson.New(http.StatusBadRequest, "confirmation_required", `Purge needs {"confirm": true}.`)
	}
	ns, ok, e := c.f.str("namespace")
	if e != nil {
		return invalid("namespace", "namespace must be a string.")
	}
	if ok && !namespaceRe.MatchString(ns) {
		return invalid("namespace", "namespace must be 1 to 64 characters of letters, digits, '.', '-' and '_'.")
	}
	if _, err := s.remove(r.Context(), "Purged by admin", func(row *tracing.JobRow) bool { return !ok || row.Namespace == ns }); err != nil {
		return s.internal(err)
	}
	if !ok {
		if _, err := s.log.DoOps(r.Context(), []tracing.Op{op(opClear, tableOp{})}); err != nil {
			return s.internal(err)
		}
		s.mu.Lock()
		clear(s.kv)
		clear(s.idem)
		clear(s.rates)
		s.mu.Unlock()
		s.nonces.Sweep(time.Time{}, func(string) bool { return true })
	}
	reply(w, http.StatusOK, map[string]any{"ok": true})
	return nil
}

func (s *Service) handleCleanup(w http.ResponseWriter, r *http.Request, _ *call) *httpjson.Error {
	st, err := s.Cleanup(r.Context())
	if err != nil {
		return s.internal(err)
	}
	reply(w, http.StatusOK, st)
	return nil
}

// refold folds a job's row from its events in the log.
func (s *Service) refold(ctx context.Context, nonce string) (tracing.JobRow, error) {
	evs, err := s.log.Trace(ctx, nonce)
	if err != nil {
		return tracing.JobRow{}, fmt.Errorf("read job trace: %w", err)
	}
	var r tracing.JobRow
	for _, ev := range evs {
		r.Apply(ev)
	}
	return r, nil
}

func (s *Service) handleAdminIntent(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	row, ok := s.view(c.param)
	if !ok {
		return httpjson.New(http.StatusNotFound, "not_found", "Intent not found.")
	}
	if row.Payload == nil {
		full, err := s.refold(r.Context(), row.Nonce)
		if err != nil {
			return s.internal(err)
		}
		row.Payload = full.Payload
	}
	m := statusView(&row)
	m["payload"] = rawOrNull(row.Payload)
	m["publisher"] = row.Publisher
	m["claimed_by"] = nullable(row.ClaimedBy)
	m["claimed_at"] = secsOrNil(row.ClaimedAt)
	m["created_at"] = msToSecs(row.CreatedAt)
	m["expires_at"] = msToSecs(row.ExpiresAt)
	m["max_attempts"] = row.MaxAttempts
	m["backoff_base"] = row.BackoffBase
	m["last_error"] = nullable(row.LastError)
	m["failed_at"] = secsOrNil(row.FailedAt)
	m["result"] = rawOrNull(row.Result)
	m["result_type"] = cmp.Or(row.ResultType, "json")
	m["nonce"] = row.Nonce
	reply(w, http.StatusOK, m)
	return nil
}

func rawOrNull(b []byte) any {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

func (s *Service) adminMoveHTTP(w http.ResponseWriter, r *http.Request, c *call, op Op) *httpjson.Error {
	st, err := s.adminMove(r.Context(), c.param, op)
	if err != nil {
		var es *errState
		switch {
		case errors.Is(err, ErrNotFound):
			return httpjson.New(http.StatusNotFound, "not_found", "Intent not found.")
		case errors.Is(err, errBusy):
			return &httpjson.Error{Status: http.StatusConflict, Code: "busy", Message: "Another operation on this intent is in progress.", RetryAfter: time.Second}
		case errors.As(err, &es):
			return httpjson.New(http.StatusConflict, "invalid_state", fmt.Sprintf("Cannot %s an intent that is %s.", op, es.status))
		}
		return s.internal(err)
	}
	reply(w, http.StatusOK, map[string]any{"ok": true, "id": c.param, "status": st})
	return nil
}

func (s *Service) handleCancel(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	return s.adminMoveHTTP(w, r, c, OpCancel)
}

func (s *Service) handleRetry(w http.ResponseWriter, r *http.Request, c *call) *httpjson.Error {
	return s.adminMoveHTTP(w, r, c, OpRetry)
}

func deadView(row *tracing.JobRow) map[string]any {
	return map[string]any{"intent_id": row.ID, "namespace": row.Namespace, "goal": row.Goal,
		"attempts": row.ClaimAttempts, "reason": row.DeadReason, "created_at": msToSecs(row.DeadAt)}
}

func (s *Service) handleDeadList(w http.ResponseWriter, _ *http.Request, _ *call) *httpjson.Error {
	rows := s.Recent(100, true)
	out := make([]map[string]any, 0, len(rows))
	for i := range rows {
		out = append(out, deadView(&rows[i]))
	}
	reply(w, http.StatusOK, out)
	return nil
}

func (s *Service) handleDead(w http.ResponseWriter, _ *http.Request, c *call) *httpjson.Error {
	row, ok := s.view(c.param)
	if !ok || row.Status != tracing.JobDead {
		return httpjson.New(http.StatusNotFound, "not_found", "Dead letter not found.")
	}
	m := deadView(&row)
	m["payload"] = rawOrNull(row.Payload)
	m["publisher"] = row.Publisher
	m["visibility"] = row.Visibility
	reply(w, http.StatusOK, m)
	return nil
}
