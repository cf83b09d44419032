package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// A node's log is taken over by another node once the node is gone: its
// entry in the nodes bucket expired or was deleted, and no live node has
// announced the log for TakeoverGrace. The survivors race to create the
// log's record in the takeover bucket BEAM_TAKEOVER_<token> (key
// takeover.<log ID>, sealed like every cluster entry); the one that
// creates it fences the log's subject, imports every sealed batch before
// the fence in order, has the node adopt the log's unfinished work
// (Config.Adopt), marks the record done and purges the subject down to the
// fence. Every step is idempotent: a record left importing by a taker that
// is gone in turn is taken again (an Update checked against its revision)
// and the whole takeover done again.

// DefaultTakeoverGrace is how long a log's node must have been gone, past
// its entry's expiry, before its log is taken over (Config.TakeoverGrace).
const DefaultTakeoverGrace = 5 * time.Second

// takeoverTick is how often a node looks for logs to take over.
const takeoverTick = time.Second

// maxTakeoversShown bounds the takeovers Status lists (the latest).
const maxTakeoversShown = 100

// States of a takeover record.
const (
	takeoverImporting = "importing"
	takeoverDone      = "done"
)

// takeoverRecord is a log's record in the takeover bucket, as
// /observability/cluster shows it.
type takeoverRecord struct {
	// Log is the ID of the log taken over.
	Log string `json:"log"`
	// Node is the node whose log it was ("" until the taker read it).
	Node string `json:"node,omitempty"`
	// Taker is the node that takes it over, TakerLog that node's log.
	Taker    string `json:"taker"`
	TakerLog string `json:"takerLog"`
	// Started is when the taker won the record.
	Started time.Time `json:"started"`
	// State is importing until the taker adopted the log's work, then done.
	State string `json:"state"`
	// Finished is when the takeover was done.
	Finished time.Time `json:"finished,omitzero"`
	// Batches is the number of batches imported.
	Batches int `json:"batches"`
	// Adopted counts the unfinished items adopted, by kind.
	Adopted map[string]int `json:"adopted,omitempty"`
	// DurationMS is how long the taker took, from winning the record.
	DurationMS int64 `json:"durationMs,omitempty"`
}

// takeovers is the node's part of the takeover bucket.
type takeovers struct {
	kv jetstream.KeyValue
	// Only the watcher goroutine uses what follows.
	gone  map[string]time.Time // log ID → when it was first seen without a live node
	done  map[string]bool      // log IDs whose takeover is done
	mine  map[string]bool      // log IDs this node took over (their homes are its to move)
	owner map[string]string    // log ID → the node last seen announcing it

	count    *prometheus.CounterVec
	duration prometheus.Histogram
}

func newTakeoverMetrics(reg prometheus.Registerer) (*prometheus.CounterVec, prometheus.Histogram, error) {
	count := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "beam_cluster_takeovers_total",
		Help: "Takeovers of a lost node's log this node ran, by outcome (done, failed).",
	}, []string{"outcome"})
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "beam_cluster_takeover_seconds",
		Help:    "How long a takeover this node did took, from winning the record to done.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120},
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{count, duration} {
			if err := reg.Register(c); err != nil {
				return nil, nil, fmt.Errorf("cluster: register metrics: %w", err)
			}
		}
	}
	return count, duration, nil
}

func takeoverKey(logID string) string { return "takeover." + logID }

// takeoverOf returns logID's takeover record and its revision; nil when
// there is none. A record no member sealed is counted and treated as
// none, with its revision (so that a survivor replaces it).
func (n *Node) takeoverOf(ctx context.Context, logID string) (*takeoverRecord, uint64, error) {
	for {
		e, err := n.take.kv.Get(ctx, takeoverKey(logID))
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			return nil, 0, nil
		case err == nil:
			var rec takeoverRecord
			err := n.openAs(typTakeover, e.Value(), &rec, func() string { return rec.Taker })
			if err == nil && rec.Log != logID {
				err = fmt.Errorf("record of %s under the key of %s", rec.Log, logID)
			}
			if err != nil {
				n.refuse("takeover", err, "log", logID)
				return nil, e.Revision(), nil
			}
			return &rec, e.Revision(), nil
		}
		if ctx.Err() != nil {
			return nil, 0, fmt.Errorf("cluster: read the takeover record of %s: %w", logID, err)
		}
		sleep(ctx, deliveredRetry)
	}
}

// watchLogs takes over the logs whose node is gone until ctx ends.
func (n *Node) watchLogs(ctx context.Context) {
	defer n.wg.Done()
	t := time.NewTicker(takeoverTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n.isFenced() {
			return
		}
		if err := n.lookForLost(ctx); err != nil && ctx.Err() == nil {
			n.lg.Warn("look for lost logs", "err", err)
		}
	}
}

// lookForLost takes over the logs of the stream that no live node
// announced for the grace period.
func (n *Node) lookForLost(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nodes, err := n.Nodes(lctx)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, info := range nodes {
		if info.LogID != "" {
			live[info.LogID] = true
			n.take.owner[info.LogID] = info.NodeID
		}
	}
	info, err := n.logs.Info(lctx, jetstream.WithSubjectFilter(n.logPrefix()+"*"))
	if err != nil {
		return fmt.Errorf("cluster: list logs: %w", err)
	}
	var lost []string
	now := time.Now()
	tk := &n.take
	candidates := map[string]bool{}
	for subj := range info.State.Subjects {
		candidates[strings.TrimPrefix(subj, n.logPrefix())] = true
	}
	// A home's log is one too: a node that never shipped a batch (it
	// served nothing yet, or came back with a new data directory) has no
	// subject, and its homes must still move when it is gone.
	for _, name := range homeNames {
		if h, ok := n.homeEntry(name); ok && h.Log != "" && !candidates[h.Log] {
			candidates[h.Log] = true
			if _, ok := tk.owner[h.Log]; !ok {
				tk.owner[h.Log] = h.Node
			}
		}
	}
	for id := range candidates {
		if id == n.cfg.Log.ID() || tk.done[id] || !logIDPattern.MatchString(id) {
			continue
		}
		if live[id] {
			delete(tk.gone, id)
			continue
		}
		since, seen := tk.gone[id]
		if !seen {
			tk.gone[id] = now
			continue
		}
		if now.Sub(since) >= n.grace() {
			lost = append(lost, id)
		}
	}
	// A home this node's takeover should have moved (the move failed: the
	// bucket was unavailable) is moved now; the takeover is done and is
	// not looked at again.
	for id := range tk.mine {
		n.moveHomesOf(ctx, id)
	}
	sort.Strings(lost)
	for _, id := range lost {
		if err := n.takeOver(ctx, id, live); err != nil {
			tk.count.WithLabelValues("failed").Inc()
			n.lg.Warn("takeover", "log", id, "err", err)
		}
	}
	return nil
}

func (n *Node) grace() time.Duration {
	if n.cfg.TakeoverGrace > 0 {
		return n.cfg.TakeoverGrace
	}
	return DefaultTakeoverGrace
}

// takeOver takes logID over unless its record says it is done, or that a
// live node is taking it over.
func (n *Node) takeOver(ctx context.Context, logID string, live map[string]bool) error {
	rec, rev, err := n.takeoverOf(ctx, logID)
	if err != nil {
		return err
	}
	self := n.cfg.Log.ID()
	switch {
	case rec != nil && rec.State == takeoverDone:
		n.take.done[logID] = true
		delete(n.take.gone, logID)
		delete(n.take.owner, logID)
		return nil
	case rec != nil && rec.TakerLog != self && !n.takerGone(rec.TakerLog, live):
		return nil // its taker is at it
	}
	mine := takeoverRecord{Log: logID, Node: n.take.owner[logID], Taker: n.cfg.NodeID, TakerLog: self,
		Started: time.Now().UTC(), State: takeoverImporting}
	if rec != nil && rec.TakerLog == self {
		mine = *rec // this node's own, left unfinished: do it again
	} else if rec != nil && mine.Node == "" {
		mine.Node = rec.Node // a lost taker's: the node it named (an empty log names none itself)
	}
	tok, err := n.seal(typTakeover, mine)
	if err != nil {
		return err
	}
	if rev == 0 {
		rev, err = n.take.kv.Create(ctx, takeoverKey(logID), []byte(tok))
	} else {
		rev, err = n.take.kv.Update(ctx, takeoverKey(logID), []byte(tok), rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || wrongLastSequence(err) {
		return nil // another node won
	}
	if err != nil {
		return fmt.Errorf("cluster: claim the takeover of %s: %w", logID, err)
	}
	n.lg.Info("taking over a lost node's log", "log", logID, "previousTaker", takerOf(rec))
	return n.runTakeover(ctx, mine, rev)
}

// takerGone reports whether no live node has announced the taker's log
// takerLog for the grace period.
func (n *Node) takerGone(takerLog string, live map[string]bool) bool {
	if live[takerLog] {
		delete(n.take.gone, takerLog)
		return false
	}
	since, seen := n.take.gone[takerLog]
	if !seen {
		n.take.gone[takerLog] = time.Now()
		return false
	}
	return time.Since(since) >= n.grace()
}

func takerOf(rec *takeoverRecord) string {
	if rec == nil {
		return ""
	}
	return rec.Taker
}

// runTakeover fences the log, imports it up to the fence, adopts its work
// and marks rec done (rev: the record's revision, which this node holds).
func (n *Node) runTakeover(ctx context.Context, rec takeoverRecord, rev uint64) error {
	logID := rec.Log
	fence, err := n.seal(typLogFence, logFence{Log: logID, Taker: n.cfg.NodeID})
	if err != nil {
		return err
	}
	msg := nats.NewMsg(n.logSubject(logID))
	msg.Header.Set(headerLogFence, fence)
	var ack *jetstream.PubAck
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err = n.js.PublishMsg(actx, msg)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("cluster: fence log %s: %w", logID, err)
		}
		sleep(ctx, 250*time.Millisecond)
	}
	fenced := time.Now()
	batches := 0
	err = n.readLog(ctx, logID, ack.Sequence, func(m logMsg) (bool, error) {
		if m.fence {
			return false, nil // the first fence: the log wrote nothing after it
		}
		rec.Node = m.node // the node that wrote the log, whatever was seen announcing it
		batches++
		return true, n.cfg.Log.Import(ctx, logID, m.node, m.seq, m.data)
	})
	if err != nil {
		return fmt.Errorf("cluster: import log %s: %w", logID, err)
	}
	imported := time.Now()
	// The work is adopted only while the record is still this node's (a
	// survivor that took this node for gone may have taken it again).
	if _, cur, err := n.takeoverOf(ctx, logID); err != nil {
		return err
	} else if cur != rev {
		return fmt.Errorf("cluster: the takeover of %s was taken again by another node", logID)
	}
	if n.cfg.Adopt != nil {
		adopted, err := n.cfg.Adopt(ctx, logID, rec.Node)
		if err != nil {
			return fmt.Errorf("cluster: adopt the work of log %s: %w", logID, err)
		}
		rec.Adopted = adopted
	}
	n.moveHomesOf(ctx, logID)
	rec.State, rec.Batches, rec.Finished = takeoverDone, batches, time.Now().UTC()
	took := rec.Finished.Sub(rec.Started)
	rec.DurationMS = took.Milliseconds()
	tok, err := n.seal(typTakeover, rec)
	if err != nil {
		return err
	}
	if _, err := n.take.kv.Update(ctx, takeoverKey(logID), []byte(tok), rev); err != nil {
		return fmt.Errorf("cluster: mark the takeover of %s done: %w", logID, err)
	}
	n.take.done[logID], n.take.mine[logID] = true, true
	delete(n.take.gone, logID)
	delete(n.take.owner, logID)
	n.take.count.WithLabelValues("done").Inc()
	n.take.duration.Observe(took.Seconds())
	// Where the time went: the fence waits for the stream to have a
	// leader (a quorum of its replicas up and caught up).
	n.lg.Info("took over a lost node's log", "log", logID, "of", rec.Node, "batches", batches,
		"adopted", rec.Adopted, "took", took, "fence", fenced.Sub(rec.Started), "import", imported.Sub(fenced))
	// The batches are in this node's log now (and shipped with it); the
	// fence stays, so the lost log can write nothing more.
	if err := n.logs.Purge(ctx, jetstream.WithPurgeSubject(n.logSubject(logID)), jetstream.WithPurgeKeep(1)); err != nil {
		n.lg.Warn("purge a log taken over", "log", logID, "err", err)
	}
	return nil
}

// takeoverList lists the takeover records (the latest first, at most
// maxTakeoversShown).
func (n *Node) takeoverList(ctx context.Context) ([]takeoverRecord, error) {
	out := []takeoverRecord{}
	if n.take.kv == nil {
		return out, nil
	}
	lister, err := n.take.kv.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: list takeovers: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	for key := range lister.Keys() {
		if rec, _, err := n.takeoverOf(ctx, strings.TrimPrefix(key, "takeover.")); err == nil && rec != nil {
			out = append(out, *rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.After(out[j].Started) })
	if len(out) > maxTakeoversShown {
		out = out[:maxTakeoversShown]
	}
	return out, nil
}
