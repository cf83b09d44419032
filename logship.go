package beam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/tracing"
)

// logReplicator is the event log's replicator in cluster mode: it ships
// each committed batch through the cluster node once there is one. Before
// that (the log is opened, and startup recovery appends, before the
// cluster starts) a batch is left to the tail the node ships when it
// starts, before anything is served.
type logReplicator struct {
	node atomic.Pointer[cluster.Node]
}

// Replicate implements tracing.Replicator.
func (r *logReplicator) Replicate(ctx context.Context, batch []byte, lastSeq int64) error {
	n := r.node.Load()
	if n == nil {
		return nil
	}
	err := n.Replicate(ctx, batch, lastSeq)
	if errors.Is(err, cluster.ErrFenced) {
		return fmt.Errorf("%w: %w", tracing.ErrFenced, err)
	}
	return err
}

// shippedLog is the event log as the cluster ships it and imports the
// logs of lost nodes into it (cluster.Log), with the adoption of what an
// import brought in (cluster.Config.Adopt).
type shippedLog struct {
	s *Server

	// ready is closed once every subsystem is open: a takeover that
	// imported a log before that waits to adopt its work.
	ready chan struct{}

	mu sync.Mutex
	// pending holds, per imported log, its durable items as its batches
	// left them, until they are adopted.
	pending map[string]*importedItems
}

// importedItems are the durable items of one imported log, by owner and
// nonce: unfinished (the work to adopt) or finished (for reads).
type importedItems struct {
	unfinished, finished map[tracing.Owner]map[string]bool
}

// note records what one batch's import left of its items: a later batch
// may finish an item, or requeue a finished one.
func (it *importedItems) note(res tracing.ImportResult) {
	move := func(to, from map[tracing.Owner]map[string]bool, byOwner map[tracing.Owner][]string) {
		for owner, nonces := range byOwner {
			set := to[owner]
			if set == nil {
				set = map[string]bool{}
				to[owner] = set
			}
			for _, nonce := range nonces {
				set[nonce] = true
				delete(from[owner], nonce)
			}
		}
	}
	move(it.unfinished, it.finished, res.Unfinished)
	move(it.finished, it.unfinished, res.Finished)
}

// adoptable returns the nonces each subsystem adopts: the unfinished
// items, and the job bus's finished jobs too, which it serves from memory
// (status, result and claim reads answer through the home).
func (it *importedItems) adoptable() map[tracing.Owner][]string {
	out := map[tracing.Owner][]string{}
	for owner, set := range it.unfinished {
		out[owner] = slices.Sorted(maps.Keys(set))
	}
	if done := it.finished[tracing.OwnerJobs]; len(done) > 0 {
		jobs := maps.Clone(done)
		maps.Copy(jobs, it.unfinished[tracing.OwnerJobs])
		out[tracing.OwnerJobs] = slices.Sorted(maps.Keys(jobs))
	}
	return out
}

// The cluster ships and imports through a shippedLog.
var _ cluster.Log = (*shippedLog)(nil)

func newShippedLog(s *Server) *shippedLog {
	return &shippedLog{s: s, ready: make(chan struct{}), pending: map[string]*importedItems{}}
}

// ID is the log's ID.
func (l *shippedLog) ID() string { return l.s.log.ID() }

// Unshipped re-encodes what the log committed after afterSeq.
func (l *shippedLog) Unshipped(ctx context.Context, afterSeq int64, fn func(batch []byte, lastSeq int64) error) error {
	return l.s.log.Unshipped(ctx, afterSeq, fn)
}

// Import appends one batch of the lost log logID (written by node) as
// this log's own and notes the items it leaves unfinished.
func (l *shippedLog) Import(ctx context.Context, logID, node string, streamSeq uint64, batch []byte) error {
	res, err := l.s.log.Import(ctx, tracing.ImportSource{Log: logID, Node: node, StreamSeq: streamSeq}, batch)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	it := l.pending[logID]
	if it == nil {
		it = &importedItems{unfinished: map[tracing.Owner]map[string]bool{}, finished: map[tracing.Owner]map[string]bool{}}
		l.pending[logID] = it
	}
	it.note(res)
	return nil
}

// Adopt has the subsystems take over the unfinished items imported from
// logID: the job bus first reads its tables again (the import applied
// their ops), then each subsystem adopts its items (Server.adopt). It
// returns the items adopted by kind.
func (l *shippedLog) Adopt(ctx context.Context, logID, _ string) (map[string]int, error) {
	select {
	case <-l.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("adopt: %w", ctx.Err())
	}
	l.mu.Lock()
	byOwner := map[tracing.Owner][]string{}
	if it := l.pending[logID]; it != nil {
		byOwner = it.adoptable()
	}
	l.mu.Unlock()
	if l.s.intent != nil {
		if err := l.s.intent.svc.Reload(ctx); err != nil {
			return nil, fmt.Errorf("adopt: reload the job bus: %w", err)
		}
	}
	n, err := l.s.adopt(ctx, byOwner)
	out := make(map[string]int, len(n))
	for owner, k := range n {
		out[string(owner)] = k
	}
	if err != nil {
		return out, err
	}
	l.mu.Lock()
	delete(l.pending, logID)
	l.mu.Unlock()
	return out, nil
}
