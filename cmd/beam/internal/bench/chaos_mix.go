package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// The mixed chaos load (ChaosConfig.Mixed) adds, next to the durable bus
// sends, synchronous intents, Intent Protocol jobs (published, claimed and
// fulfilled or failed over the job bus's HTTP API, HMAC-signed) and
// pipeline envelopes routed through actor agents, all on the server that
// is killed. A share of the claims is failed on purpose (the job is
// requeued with backoff, or dead after its last attempt), and one actor
// fails a share of its hops (retried by the pipeline policy).

// chaosSyncIntent is the intent type of the mixed load's synchronous
// intents.
const chaosSyncIntent = "chaos.sync"

// chaosHops is the route length of the mixed load's envelopes.
const chaosHops = 3

// chaosFailPercent is the share of job claims the workers fail and of hops
// the flaky actor fails, on purpose.
const chaosFailPercent = 20

// chaosClaimTimeout is the job bus's claim lease in a mixed run: a claim
// cut off by a kill is claimable again this long after it was made.
const chaosClaimTimeout = "2s"

// ChaosMixReport counts what the mixed load did (ChaosConfig.Mixed).
type ChaosMixReport struct {
	// SyncAttempted synchronous intents were sent; SyncAcked were answered
	// with a success result.
	SyncAttempted int64 `json:"sync_attempted"`
	SyncAcked     int64 `json:"sync_acked"`
	// JobsAttempted publishes were tried (each with its own
	// Idempotency-Key, resent on a failure); JobsPublished were answered
	// 201; JobsFulfilled fulfils and JobsFailed fails (on purpose) were
	// answered 200; JobsLog counts the log's jobs by status at the end.
	JobsAttempted int64            `json:"jobs_attempted"`
	JobsPublished int64            `json:"jobs_published"`
	JobsFulfilled int64            `json:"jobs_fulfilled"`
	JobsFailed    int64            `json:"jobs_failed"`
	JobsLog       map[string]int64 `json:"jobs_log"`
	// EnvelopesAttempted creates were tried; EnvelopesCreated were answered
	// 201; Envelopes counts the log's envelopes by status at the end.
	EnvelopesAttempted int64            `json:"envelopes_attempted"`
	EnvelopesCreated   int64            `json:"envelopes_created"`
	Envelopes          map[string]int64 `json:"envelopes"`
	// HopFailures is how many hops the flaky actor failed on purpose.
	HopFailures int64 `json:"hop_failures"`
	// Failures counts the last error of the operations never acknowledged,
	// by kind and code.
	Failures map[string]int64 `json:"failures,omitempty"`
}

// chaosMix is the state of the mixed load.
type chaosMix struct {
	r      *chaosRun
	actors []*chaosAgent
	jobs   *jobsClient
	ns     string

	mu        sync.Mutex
	syncAcked map[string]string          // nonce → recipient
	syncSeen  map[string]map[string]bool // agent → sync nonces it saw
	published map[string]string          // idempotency key → job id (answered 201)
	fulfilled map[string]int             // job id → fulfils answered 200
	results   map[string]string          // job id → the result the acknowledged fulfil sent
	failed    map[string]int             // job id → fails answered 200
	pending   map[string]bool            // published job ids not yet known fulfilled or dead
	created   map[string]string          // envelope id → creator (answered 201)
	ran       map[string]map[string]bool // envelope id → actors that ran a hop of it successfully
	failures  map[string]int64

	syncAttempted, jobsAttempted, envAttempted, hopFailures atomic.Int64
}

// setupMix prepares a mixed run's server options: the job bus on a fixed
// loopback address with a fresh key and a short claim lease, and a pipeline
// retry policy.
func (r *chaosRun) setupMix() error {
	intentAddr, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	secret := "chaos_" + hex.EncodeToString(key)
	pol := filepath.Join(r.cfg.DataDir, "chaos-mesh-policies.json")
	raw := []byte(`{"default":{"maxAttempts":4,"backoff":"constant","initialDelay":"200ms"}}`)
	if err := os.WriteFile(pol, raw, 0o600); err != nil {
		return fmt.Errorf("chaos: write the pipeline policies: %w", err)
	}
	r.opts.Args = append(r.opts.Args, "--intent-listen", intentAddr, "--mesh-policies", pol, "--mesh-hop-timeout", "5s")
	r.opts.Env = append(r.opts.Env, "BUS_SECRET="+secret, "BEAM_INTENT_CLAIM_TIMEOUT="+chaosClaimTimeout)
	ns := make([]byte, 4)
	_, _ = rand.Read(ns)
	r.mix = &chaosMix{
		r:  r,
		ns: "chaos-" + hex.EncodeToString(ns),
		jobs: &jobsClient{cfg: JobsConfig{URL: "http://" + intentAddr, Key: secret, Sign: true},
			http: r.hc, errs: map[string]int64{}},
		syncAcked: map[string]string{}, syncSeen: map[string]map[string]bool{},
		published: map[string]string{}, fulfilled: map[string]int{}, results: map[string]string{},
		failed: map[string]int{}, pending: map[string]bool{}, created: map[string]string{}, failures: map[string]int64{},
		ran: map[string]map[string]bool{},
	}
	return nil
}

func (m *chaosMix) fail(kind, code string) {
	m.mu.Lock()
	m.failures[kind+":"+code]++
	m.mu.Unlock()
}

// handleSync is the synchronous intents' handler of agent a: it records
// what a saw and succeeds.
func (m *chaosMix) handleSync(a *chaosAgent) agents.Handler {
	me := a.id.BeamID
	m.mu.Lock()
	if m.syncSeen[me] == nil { // a handler made again when a moved agent reconnects keeps what it saw
		m.syncSeen[me] = map[string]bool{}
	}
	m.mu.Unlock()
	return func(_ context.Context, in *agents.Intent) agents.Reply {
		m.mu.Lock()
		m.syncSeen[me][in.Nonce] = true
		m.mu.Unlock()
		return agents.Success(map[string]any{"ok": true})
	}
}

// addActors registers and connects the pipeline actors: each passes the
// envelope's payload on; the first fails chaosFailPercent of its (envelope,
// attempt) pairs.
func (m *chaosMix) addActors(ctx context.Context, org string) ([]*chaosAgent, error) {
	actors, err := m.r.newAgents(ctx, org, m.r.prefix("actor"), chaosHops, 1, true, func(a *chaosAgent, c *agents.Client) {
		me := a.id.BeamID
		c.HandleMesh(func(_ context.Context, h *agents.MeshHop) (any, error) {
			if a.flaky && onPurpose(fmt.Sprintf("%s/%d", h.Envelope.ID, h.Attempt)) {
				m.hopFailures.Add(1)
				return nil, errors.New("chaos: failing on purpose")
			}
			m.mu.Lock()
			if m.ran[h.Envelope.ID] == nil {
				m.ran[h.Envelope.ID] = map[string]bool{}
			}
			m.ran[h.Envelope.ID][me] = true
			m.mu.Unlock()
			return h.Envelope.Payload, nil
		})
	})
	if err != nil {
		return nil, err
	}
	m.actors = actors
	return actors, nil
}

// onPurpose reports whether the operation keyed by key fails on purpose: a
// deterministic chaosFailPercent share of keys.
func onPurpose(key string) bool {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()%100 < chaosFailPercent
}

// syncOne sends one synchronous intent from → to; a success result is an
// acknowledgement.
func (m *chaosMix) syncOne(ctx context.Context, from, to *chaosAgent) {
	m.syncAttempted.Add(1)
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	res, err := from.cl().Send(sctx, to.id.BeamID, chaosSyncIntent, map[string]any{"sync": true})
	cancel()
	if err != nil || res == nil || !res.Success {
		code := agents.ErrorCode(err)
		if code == "" {
			code = "UNREACHABLE"
		}
		m.fail("sync", code)
		return
	}
	m.mu.Lock()
	m.syncAcked[res.Nonce] = to.id.BeamID
	m.mu.Unlock()
}

// publishOne publishes one job, resending under the same Idempotency-Key
// while the server is unreachable or busy.
func (m *chaosMix) publishOne(ctx context.Context) {
	m.jobsAttempted.Add(1)
	kb := make([]byte, 12)
	_, _ = rand.Read(kb)
	key := hex.EncodeToString(kb)
	body, _ := json.Marshal(map[string]any{"goal": "chaos", "namespace": m.ns, "payload": map[string]any{"k": key},
		"max_attempts": 3, "backoff_base": 1})
	hdr := http.Header{"Idempotency-Key": {key}}
	last := ""
	for try := range 6 {
		if try > 0 && !pause(ctx, time.Duration(100*try)*time.Millisecond) {
			return
		}
		st, b, err := m.jobs.doAt(ctx, m.pubURL(), http.MethodPost, "/intent", "", body, hdr)
		switch {
		case err != nil:
			last = "UNREACHABLE"
			continue
		case st == http.StatusCreated:
			id := receiptID(b)
			if id == "" {
				m.fail("publish", "BAD_RECEIPT")
				return
			}
			m.mu.Lock()
			m.published[key] = id
			if m.fulfilled[id] == 0 {
				m.pending[id] = true
			}
			m.mu.Unlock()
			return
		case st >= 500 || st == http.StatusConflict || st == http.StatusTooManyRequests:
			last = errCode(st, b)
			continue
		default:
			m.fail("publish", errCode(st, b))
			return
		}
	}
	m.fail("publish", last)
}

// work claims the run's jobs and fulfils them, or fails chaosFailPercent
// of the claims, until ctx ends. A fulfil or fail is resent with the same
// claim token while the server is unreachable; an answer 200 is its
// acknowledgement.
func (m *chaosMix) work(ctx context.Context, worker int) {
	for ctx.Err() == nil {
		base := m.workURL(worker)
		st, b, err := m.jobs.doAt(ctx, base, http.MethodPost, "/claim", "namespace="+url.QueryEscape(m.ns), nil, nil)
		if err != nil || st != http.StatusOK {
			pause(ctx, 100*time.Millisecond) // empty, unreachable or busy
			continue
		}
		var got struct {
			ID         string `json:"id"`
			ClaimToken string `json:"claim_token"`
		}
		if json.Unmarshal(b, &got) != nil || got.ID == "" {
			m.fail("claim", "BAD_CLAIM")
			continue
		}
		op, result := "fulfill", []byte(nil)
		body, _ := json.Marshal(map[string]any{"claim_token": got.ClaimToken, "error": "chaos: failing on purpose"})
		if !onPurpose(got.ID + "/" + got.ClaimToken) {
			result, _ = json.Marshal(map[string]any{"id": got.ID, "worker": worker})
			body, _ = json.Marshal(map[string]any{"claim_token": got.ClaimToken, "result": json.RawMessage(result)})
		} else {
			op = "fail"
		}
		for try := range 6 {
			if try > 0 && !pause(ctx, time.Duration(100*try)*time.Millisecond) {
				return
			}
			st, b, err := m.jobs.doAt(ctx, m.workURL(worker), http.MethodPost, "/"+op+"/"+url.PathEscape(got.ID), "", body, nil)
			if err != nil || st >= 500 {
				continue
			}
			switch {
			case st != http.StatusOK:
				m.fail(op, errCode(st, b)) // e.g. the lease expired and the job went to another claim
			case result != nil:
				m.mu.Lock()
				m.fulfilled[got.ID]++
				m.results[got.ID] = string(result)
				delete(m.pending, got.ID)
				m.mu.Unlock()
			default:
				m.mu.Lock()
				m.failed[got.ID]++
				m.mu.Unlock()
			}
			break
		}
	}
}

// createEnvelope creates one envelope by from routed through the actors
// from a random start; 201 is its acknowledgement. A create whose answer
// is lost is not repeated (the gateway has no idempotency key for it).
func (m *chaosMix) createEnvelope(ctx context.Context, from *chaosAgent, start int) {
	m.envAttempted.Add(1)
	route := make([]string, chaosHops)
	for i := range route {
		route[i] = m.actors[(start+i)%len(m.actors)].id.BeamID
	}
	body, _ := json.Marshal(map[string]any{"route": route, "payload": map[string]any{"chaos": true}})
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, base := from.at()
	_, b, err := call(cctx, m.r.hc, http.MethodPost, base+"/api/v1/mesh", body,
		http.Header{"X-Api-Key": {from.apiKey}}, http.StatusCreated)
	if err != nil {
		code := "UNREACHABLE"
		var ae *agents.Error
		if errors.As(err, &ae) {
			code = ae.Code
		}
		m.fail("envelope", code)
		return
	}
	id := receiptID(b)
	if id == "" {
		m.fail("envelope", "BAD_RECEIPT")
		return
	}
	m.mu.Lock()
	m.created[id] = from.id.BeamID
	m.mu.Unlock()
}

// pubURL is the job bus listener publishes go to: the server's, or in a
// cluster run the owner node's (another live one while it is down).
func (m *chaosMix) pubURL() string {
	if m.r.cl != nil {
		return m.r.cl.intentURL(m.r.cl.live(roleOwner))
	}
	return m.jobs.cfg.URL
}

// workURL is the job bus listener worker w claims and fulfils through:
// the server's, or in a cluster run a node other than the owner.
func (m *chaosMix) workURL(w int) string {
	if m.r.cl != nil {
		return m.r.cl.intentURL(m.r.cl.live(m.r.cl.workerNode(w)))
	}
	return m.jobs.cfg.URL
}

// receiptID returns the id of a JSON answer {"id": …}, "" when it has
// none.
func receiptID(b []byte) string {
	var got struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(b, &got)
	return got.ID
}

// pause waits d or until ctx ends; false when ctx ended.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// settled reports whether the mixed load is done: every published job is
// known fulfilled or dead, and no envelope of the creators is open.
func (m *chaosMix) settled(ctx context.Context, creators []*chaosAgent) bool {
	m.mu.Lock()
	ids := make([]string, 0, len(m.pending))
	for id := range m.pending {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	slices.Sort(ids)
	open := 0
	for _, id := range ids[:min(len(ids), 100)] {
		st, b, err := m.jobs.do(ctx, http.MethodGet, "/status/"+url.PathEscape(id), "", nil, nil)
		if err != nil || st != http.StatusOK {
			open++
			continue
		}
		var s struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(b, &s) != nil || (s.Status != tracing.JobFulfilled && s.Status != tracing.JobDead) {
			open++
			continue
		}
		m.mu.Lock()
		delete(m.pending, id) // fulfilled though its answer was lost, or dead
		m.mu.Unlock()
	}
	if open > 0 || len(ids) > 100 {
		return false
	}
	var notDone []string
	for _, s := range tracing.MeshStatuses {
		if !s.Terminal() {
			notDone = append(notDone, string(s))
		}
	}
	for _, c := range creators {
		_, b, err := call(ctx, m.r.hc, http.MethodGet, m.r.url+"/api/v1/mesh?limit=1&status="+strings.Join(notDone, ","), nil,
			http.Header{"X-Api-Key": {c.apiKey}}, http.StatusOK)
		if err != nil {
			return false
		}
		var l struct {
			Total int64 `json:"total"`
		}
		if json.Unmarshal(b, &l) != nil || l.Total > 0 {
			return false
		}
	}
	return true
}

// report fills the counts of rep.Mix.
func (m *chaosMix) report(rep *ChaosReport) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mr := &ChaosMixReport{
		SyncAttempted: m.syncAttempted.Load(), SyncAcked: int64(len(m.syncAcked)),
		JobsAttempted: m.jobsAttempted.Load(), JobsPublished: int64(len(m.published)),
		EnvelopesAttempted: m.envAttempted.Load(), EnvelopesCreated: int64(len(m.created)),
		JobsLog: map[string]int64{}, Envelopes: map[string]int64{},
	}
	for _, n := range m.fulfilled {
		mr.JobsFulfilled += int64(n)
	}
	for _, n := range m.failed {
		mr.JobsFailed += int64(n)
	}
	mr.HopFailures = m.hopFailures.Load()
	if len(m.failures) > 0 {
		mr.Failures = m.failures
	}
	rep.Mix = mr
}

// mixLog is what the check reads of the log for the mixed load.
type mixLog struct {
	jobs map[string]*tracing.JobRow // job id → folded row
	// jobAcks counts each job's acked (fulfilled) events, jobFails its
	// fail events.
	jobAcks, jobFails map[string]int
	// meshEnds counts each envelope nonce's steps to a terminal status.
	meshEnds map[string]int
}

// readMixLog streams the whole log once and folds the jobs and the
// envelopes' terminal steps.
func readMixLog(ctx context.Context, lg *tracing.Log) (*mixLog, error) {
	ml := &mixLog{jobs: map[string]*tracing.JobRow{}, jobAcks: map[string]int{}, jobFails: map[string]int{}, meshEnds: map[string]int{}}
	var after int64
	for {
		evs, err := lg.Events(ctx, after, 5000)
		if err != nil {
			return nil, fmt.Errorf("chaos: read the log: %w", err)
		}
		if len(evs) == 0 {
			return ml, nil
		}
		for _, ev := range evs {
			after = ev.Seq
			if id, ok := strings.CutPrefix(ev.Nonce, "job:"); ok && ev.Details.Job != nil {
				row := ml.jobs[id]
				if row == nil {
					row = &tracing.JobRow{}
					ml.jobs[id] = row
				}
				row.Apply(ev)
				if ev.State == tracing.Acked {
					ml.jobAcks[id]++
				}
				if ev.Details.Job.Op == "fail" {
					ml.jobFails[id]++
				}
			}
			if len(ev.Details.Mesh) > 0 {
				var st tracing.MeshStep
				if json.Unmarshal(ev.Details.Mesh, &st) == nil && st.Status.Terminal() {
					ml.meshEnds[ev.Nonce]++
				}
			}
		}
	}
}

// check returns the mixed load's invariants (e), (f) and (g) and counts
// the log's jobs and envelopes into rep.Mix.
func (m *chaosMix) check(ctx context.Context, lg *tracing.Log, rep *ChaosReport) ([]*Invariant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ml, err := readMixLog(ctx, lg)
	if err != nil {
		return nil, err
	}

	// (e) every acknowledged synchronous intent is acked in the log, and
	// its recipient saw it.
	e := &Invariant{Name: "(e) every acknowledged synchronous intent is acked in the log and reached its recipient"}
	for nonce, to := range m.syncAcked {
		e.Checked++
		row, ok, err := lg.Intent(ctx, nonce)
		switch {
		case err != nil:
			return nil, fmt.Errorf("chaos: read intent %s: %w", nonce, err)
		case !ok:
			e.violate("acknowledged intent %s is not in the log", nonce)
		case row.Status != tracing.Acked:
			e.violate("acknowledged intent %s ended %s", nonce, row.Status)
		case !m.syncSeen[to][nonce]:
			e.violate("intent %s is acked but %s never saw it", nonce, to)
		}
	}

	// (f) every acknowledged publish is one job in the log and ends
	// fulfilled or dead; every acknowledged fulfil is its job's one
	// fulfil, with its result; every acknowledged fail is in the log; no
	// job is fulfilled twice.
	f := &Invariant{Name: "(f) every acknowledged job publish, fulfil and fail is in the log; no job is published twice or fulfilled twice"}
	acked := map[string]bool{}
	for _, id := range m.published {
		acked[id] = true
	}
	byKey := map[string][]string{}
	for id, row := range ml.jobs {
		if row.Namespace != m.ns {
			continue
		}
		rep.Mix.JobsLog[row.Status]++
		var p struct {
			K string `json:"k"`
		}
		_ = json.Unmarshal(row.Payload, &p)
		byKey[p.K] = append(byKey[p.K], id)
		f.Checked++
		if n := ml.jobAcks[id]; n > 1 {
			f.violate("job %s was fulfilled %d times in the log", id, n)
		}
		if acked[id] && row.Status != tracing.JobFulfilled && row.Status != tracing.JobDead {
			f.violate("job %s ended %s", id, row.Status)
		}
	}
	for key, id := range m.published {
		f.Checked++
		row, ok := ml.jobs[id]
		switch {
		case !ok:
			f.violate("acknowledged job %s (key %s) is not in the log", id, key)
		case len(byKey[key]) > 1:
			f.violate("idempotency key %s published %d jobs: %v", key, len(byKey[key]), byKey[key])
		case row.Payload == nil:
			f.violate("job %s lost its payload", id)
		}
	}
	for id, n := range m.fulfilled {
		f.Checked++
		row, ok := ml.jobs[id]
		switch {
		case n > 1:
			f.violate("job %s: %d fulfils acknowledged", id, n)
		case !ok:
			f.violate("fulfilled job %s is not in the log", id)
		case row.Status != tracing.JobFulfilled:
			f.violate("job %s: fulfil acknowledged, the log says %s", id, row.Status)
		case !jsonEqual(row.Result, []byte(m.results[id])):
			f.violate("job %s: fulfilled with %s, the log holds %s", id, m.results[id], row.Result)
		}
	}

	// (g) every acknowledged envelope is in the log, and every envelope
	// finishes exactly once.
	g := &Invariant{Name: "(g) every acknowledged envelope is in the log and every envelope finishes exactly once"}
	for id, n := range m.failed {
		f.Checked++
		if got := ml.jobFails[id]; got < n {
			f.violate("job %s: %d fails acknowledged, the log has %d", id, n, got)
		}
	}

	rows, err := lg.MeshRows(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: read envelopes: %w", err)
	}
	seen := map[string]bool{}
	for _, row := range rows {
		seen[row.ID] = true
		rep.Mix.Envelopes[string(row.Status)]++
		g.Checked++
		if n := ml.meshEnds[row.Nonce]; n != 1 || !row.Status.Terminal() {
			g.violate("envelope %s ended %s after %d terminal steps", row.ID, row.Status, n)
		}
	}
	for id := range m.created {
		g.Checked++
		if !seen[id] {
			g.violate("acknowledged envelope %s is not in the log", id)
		}
	}
	return []*Invariant{e, f, g}, nil
}

// jsonEqual reports whether a and b hold the same JSON value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
