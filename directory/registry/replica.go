package registry

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"

	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/internal/httpjson"
)

// Replication (cluster mode). With a Replicator set, an operation (ops.go)
// does not commit on its own: it runs once in a transaction that is rolled
// back (a dry run that validates it against the current state), its JSON
// is published as one entry of the cluster's stream (which signs it), and
// every node — this one included — runs it again in stream order in Apply,
// validating it the same way, together with the stream sequence it reached
// (registry_replica), in one transaction. The origin's call returns once
// its own node applied the operation, so the change is visible to the
// caller's next request wherever it lands in the same order on every node.
//
// The publish expects the stream's last entry to be the one this node
// applied last; when another node got in first, the mutation fails with a
// stale error, the route waits until this node applied that entry and runs
// again from the start (serve), so each change is validated against the
// state every node will apply it to.
//
// A remote change is applied under the write lock and then the in-memory
// registry is reloaded from the rows; the origin's own change is applied
// while its caller holds the write lock, and the caller updates memory as a
// single node does.

var replicaSchema = []string{
	`CREATE TABLE IF NOT EXISTS registry_replica (
		id  INTEGER PRIMARY KEY CHECK (id = 1),
		seq INTEGER NOT NULL
	)`,
}

// Replicator appends registry changes to the stream every node of a
// cluster applies (federation/cluster).
type Replicator interface {
	// Publish appends op (an operation's JSON), signed so that only the
	// cluster's members can publish one and bound to the position after
	// it, if the stream's last entry is still after, and returns the
	// entry's sequence. When the stream has moved past after it returns an
	// error wrapping ErrStale.
	Publish(ctx context.Context, after uint64, op []byte) (uint64, error)
	// Settle returns once the other serving nodes applied the stream up
	// to seq (or did not answer in time: they are down and catch up before
	// they serve again).
	Settle(ctx context.Context, seq uint64)
	// Replicating reports whether cluster mode is on: the node caught up
	// on the stream so far and applies it, so every mutation from now on
	// is published and applied by Apply.
	Replicating() bool
}

// ErrStale is wrapped by Replicator.Publish when the stream moved past the
// sequence the change was validated at.
var ErrStale = errors.New("registry: the cluster stream moved on")

// staleError is a mutation that lost the race for the stream position
// after; serve runs the route again once after is applied.
type staleError struct{ after uint64 }

func (e staleError) Error() string {
	return fmt.Sprintf("registry: stream moved past %d", e.after)
}
func (e staleError) Unwrap() error { return ErrStale }

// errDryRun ends the recording run of a replicated mutation.
var errDryRun = errors.New("registry: dry run")

// maxStaleRetries bounds how often one request runs again after losing the
// stream position to another node.
const maxStaleRetries = 16

// dbtx is what an operation writes through: the log writer's transaction.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	NamedExecContext(ctx context.Context, query string, arg any) (sql.Result, error)
}

// replica is the replication state of a registry.
type replica struct {
	mu      sync.Mutex
	applied uint64
	moved   chan struct{}         // closed and replaced when applied grows
	pending map[string]chan error // operation id → its waiting origin

	rejected atomic.Uint64 // entries skipped as invalid
}

// replicator returns Config.Replicator once it replicates (cluster mode);
// nil before and without a cluster.
func (r *Registry) replicator() Replicator {
	if rep := r.cfg.Replicator; rep != nil && rep.Replicating() {
		return rep
	}
	return nil
}

// Applied returns the last stream sequence this registry applied (0 when
// none; kept in its SQLite file across restarts).
func (r *Registry) Applied() uint64 {
	r.repl.mu.Lock()
	defer r.repl.mu.Unlock()
	return r.repl.applied
}

// WaitApplied waits until the stream sequence seq has been applied.
func (r *Registry) WaitApplied(ctx context.Context, seq uint64) error {
	for {
		r.repl.mu.Lock()
		applied, moved := r.repl.applied, r.repl.moved
		r.repl.mu.Unlock()
		if applied >= seq {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("registry: wait for stream sequence %d (applied %d): %w", seq, applied, ctx.Err())
		}
	}
}

// loadApplied reads the stored stream position at Open.
func (r *Registry) loadApplied(ctx context.Context) error {
	var seq int64
	err := r.log.ReadDB().GetContext(ctx, &seq, `SELECT seq FROM registry_replica WHERE id = 1`)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("registry: load stream position: %w", err)
	}
	r.repl.applied = uint64(seq)
	r.repl.moved = make(chan struct{})
	r.repl.pending = map[string]chan error{}
	return nil
}

// do runs operation o (ops.go) in the log's writer transaction; in cluster
// mode it replicates o (see the top of this file).
func (r *Registry) do(ctx context.Context, o *op) error {
	rep := r.replicator()
	if rep == nil {
		return r.doLocal(ctx, func(tx *sqlx.Tx) error { return r.run(ctx, tx, o) })
	}
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	o.ID = hex.EncodeToString(id)
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("registry: encode operation: %w", err)
	}
	if len(data) > maxOpBytes {
		return httpjson.Errorf(http.StatusConflict, "REGISTRY_ENTRY_TOO_LARGE",
			"the change is %d bytes, more than a cluster's registry entry holds (%d)", len(data), maxOpBytes)
	}
	err = r.doLocal(ctx, func(tx *sqlx.Tx) error {
		if err := r.run(ctx, tx, o); err != nil {
			return err
		}
		return errDryRun
	})
	if !errors.Is(err, errDryRun) {
		return err
	}
	done := make(chan error, 1)
	r.repl.mu.Lock()
	after := r.repl.applied
	r.repl.pending[o.ID] = done
	r.repl.mu.Unlock()
	unpend := func() {
		r.repl.mu.Lock()
		delete(r.repl.pending, o.ID)
		r.repl.mu.Unlock()
	}
	seq, err := rep.Publish(ctx, after, data)
	if err != nil {
		unpend()
		if errors.Is(err, ErrStale) {
			return staleError{after: after}
		}
		return fmt.Errorf("registry: replicate operation: %w", err)
	}
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		rep.Settle(ctx, seq)
		return nil
	case <-ctx.Done():
		unpend()
		return fmt.Errorf("registry: wait for the operation to apply: %w", ctx.Err())
	}
}

// Apply applies the stream entry seq, an operation published by any node
// whose signature the cluster verified, in stream order: the operation,
// validated against the current state as the origin validated it (ops.go),
// and the new position in one transaction, then memory. An entry that does
// not decode or does not validate is skipped with a warning and counted
// (Rejected), its position still recorded so the stream moves on. Entries
// at or below Applied are skipped.
func (r *Registry) Apply(ctx context.Context, seq uint64, data []byte) error {
	o, decodeErr := decodeOp(data)
	id := ""
	if decodeErr == nil {
		id = o.ID
	}
	r.repl.mu.Lock()
	if seq <= r.repl.applied {
		r.repl.mu.Unlock()
		return nil
	}
	done, own := r.repl.pending[id]
	if own {
		delete(r.repl.pending, id)
	}
	r.repl.mu.Unlock()
	if !own {
		// The origin of an own operation holds the write lock for it.
		r.writeMu.Lock()
		defer r.writeMu.Unlock()
	}
	applyErr := decodeErr
	if applyErr == nil {
		applyErr = r.doLocal(ctx, func(tx *sqlx.Tx) error {
			if err := r.run(ctx, tx, o); err != nil {
				return err
			}
			return putApplied(ctx, tx, seq)
		})
	}
	if applyErr != nil {
		if ctx.Err() != nil {
			if own {
				done <- applyErr
			}
			return fmt.Errorf("registry: apply stream entry %d: %w", seq, applyErr)
		}
		if err := r.skip(ctx, seq, applyErr); err != nil {
			if own {
				done <- applyErr
			}
			return err
		}
	}
	if !own && applyErr == nil {
		if err := r.reload(ctx); err != nil {
			return err
		}
	}
	r.moveTo(seq)
	if own {
		if applyErr != nil {
			applyErr = fmt.Errorf("registry: apply operation: %w", applyErr)
		}
		done <- applyErr
	}
	return nil
}

// Reject skips the stream entry seq without applying it (the cluster
// refused its signature or position): its position is recorded so later
// entries apply, and it is counted (Rejected).
func (r *Registry) Reject(ctx context.Context, seq uint64, reason error) error {
	r.repl.mu.Lock()
	if seq <= r.repl.applied {
		r.repl.mu.Unlock()
		return nil
	}
	r.repl.mu.Unlock()
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	if err := r.skip(ctx, seq, reason); err != nil {
		return err
	}
	r.moveTo(seq)
	return nil
}

// Rejected returns how many stream entries this registry skipped as
// invalid since it opened.
func (r *Registry) Rejected() uint64 { return r.repl.rejected.Load() }

// skip records position seq for an entry that is not applied.
func (r *Registry) skip(ctx context.Context, seq uint64, reason error) error {
	r.repl.rejected.Add(1)
	r.lg.Warn("registry stream entry skipped", "seq", seq, "err", reason)
	if err := r.doLocal(ctx, func(tx *sqlx.Tx) error { return putApplied(ctx, tx, seq) }); err != nil {
		return fmt.Errorf("registry: record stream position %d: %w", seq, err)
	}
	return nil
}

// moveTo records in memory that seq is applied.
func (r *Registry) moveTo(seq uint64) {
	r.repl.mu.Lock()
	r.repl.applied = seq
	close(r.repl.moved)
	r.repl.moved = make(chan struct{})
	r.repl.mu.Unlock()
}

func putApplied(ctx context.Context, tx *sqlx.Tx, seq uint64) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO registry_replica (id, seq) VALUES (1, ?)
		ON CONFLICT(id) DO UPDATE SET seq = excluded.seq`, int64(seq)); err != nil {
		return fmt.Errorf("record stream position: %w", err)
	}
	return nil
}

// reload replaces the in-memory registry with the rows, keeping the newer
// last_seen values memory holds.
func (r *Registry) reload(ctx context.Context) error {
	fresh := &Registry{log: r.log, cfg: r.cfg, lg: r.lg,
		agents: map[string]*entry{}, rules: map[string][]Rule{}, ruleBy: map[int64]Rule{}}
	if err := fresh.load(ctx); err != nil {
		return fmt.Errorf("registry: reload: %w", err)
	}
	if err := fresh.loadOrgs(ctx); err != nil {
		return fmt.Errorf("registry: reload: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range fresh.agents {
		if old, ok := r.agents[id]; ok {
			storeMax(&e.lastSeen, old.lastSeen.Load())
			storeMax(&e.persisted, old.persisted.Load())
		}
	}
	r.agents, r.rules, r.ruleBy = fresh.agents, fresh.rules, fresh.ruleBy
	r.orgs, r.members, r.tombstones = fresh.orgs, fresh.members, fresh.tombstones
	return nil
}

// serveReplicated runs h and, when it lost the stream position to another
// node, runs it again on the same body once that node's change is applied.
func (r *Registry) serveReplicated(h apiHandler, w http.ResponseWriter, req *http.Request) error {
	body, readErr := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBodyBytes))
	for range maxStaleRetries {
		if readErr != nil {
			req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{readErr}))
		} else {
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		err := h(w, req)
		var se staleError
		if !errors.As(err, &se) {
			return err
		}
		if err := r.WaitApplied(req.Context(), se.after+1); err != nil {
			return err
		}
	}
	return httpjson.New(http.StatusServiceUnavailable, "CLUSTER_BUSY", "the registry is changing on other nodes; retry")
}

// errReader returns err on every read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
