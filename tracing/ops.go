package tracing

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/jmoiron/sqlx"
)

// Op is a replicable side write: state a package keeps in tables of its
// own in the log's file (outside the events), written by the function
// registered for Kind (RegisterOp) inside the writer's transaction. The
// same function applies it on this node (DoOps) and on a node that
// imports this log (Import), so both write the same rows. In cluster mode
// the log records each op (log_ops) and ships it with the events of its
// request.
type Op struct {
	// Kind names the registered function, e.g. "jobs.kv.set".
	Kind string
	// Payload is the function's argument, a JSON value.
	Payload json.RawMessage
}

// maxOpPayload bounds one op's payload.
const maxOpPayload = maxDetailsBytes

var opRegistry struct {
	mu sync.RWMutex
	m  map[string]func(tx *sqlx.Tx, payload []byte) error
}

// RegisterOp registers the function that applies ops of kind; packages call
// it from init. It panics on an empty kind or a kind registered twice.
// apply runs inside the writer's transaction: it must only write its
// package's own tables, must not block, and must give the same rows for
// the same payload on every node.
func RegisterOp(kind string, apply func(tx *sqlx.Tx, payload []byte) error) {
	if kind == "" || apply == nil {
		panic("tracing: RegisterOp needs a kind and a function")
	}
	opRegistry.mu.Lock()
	defer opRegistry.mu.Unlock()
	if opRegistry.m == nil {
		opRegistry.m = make(map[string]func(*sqlx.Tx, []byte) error)
	}
	if _, dup := opRegistry.m[kind]; dup {
		panic(fmt.Sprintf("tracing: op %q registered twice", kind))
	}
	opRegistry.m[kind] = apply
}

func opFunc(kind string) func(*sqlx.Tx, []byte) error {
	opRegistry.mu.RLock()
	defer opRegistry.mu.RUnlock()
	return opRegistry.m[kind]
}

// DoOps is Do with ops instead of a function: after the events are
// written, each op's registered function runs, in order, inside the same
// transaction (in a savepoint: if one fails, the call is rejected with a
// *FuncError and nothing of it is written). An op of an unregistered kind
// or a payload that is not JSON is a *ValidationError.
func (l *Log) DoOps(ctx context.Context, ops []Op, events ...Event) ([]Event, error) {
	if len(ops) == 0 {
		return l.Append(ctx, events...)
	}
	for i, op := range ops {
		if opFunc(op.Kind) == nil {
			return nil, &ValidationError{Index: i, Field: "op", Reason: fmt.Sprintf("no op of kind %q is registered", op.Kind)}
		}
		if len(op.Payload) > maxOpPayload || !json.Valid(op.Payload) {
			return nil, &ValidationError{Index: i, Field: "op", Reason: fmt.Sprintf("op %q: the payload is not JSON of at most %d bytes", op.Kind, maxOpPayload)}
		}
	}
	return l.submit(ctx, nil, events, ops)
}

// applyOps runs r's ops in the writer (inside r's savepoint) and, in
// cluster mode, records them after the request's events.
func (l *Log) applyOps(tx *sqlx.Tx, r *request) error {
	anchor := l.w.nextSeq - 1
	for i, op := range r.ops {
		if err := l.applyOp(tx, op, anchor, l.w.opCount+int64(i)+1); err != nil {
			return err
		}
		r.opAnchors[i] = anchor
	}
	return nil
}

// applyOp applies one op and, in cluster mode, records it with its
// ordinal id after the events up to anchor.
func (l *Log) applyOp(tx *sqlx.Tx, op Op, anchor, id int64) error {
	fn := opFunc(op.Kind)
	if fn == nil {
		return fmt.Errorf("op %q: no function is registered", op.Kind)
	}
	if err := fn(tx, op.Payload); err != nil {
		return fmt.Errorf("op %q: %w", op.Kind, err)
	}
	if !l.recordOps() {
		return nil
	}
	if _, err := tx.Exec(`INSERT INTO log_ops(id, seq, kind, payload) VALUES(?, ?, ?, ?)`, id, anchor, op.Kind, string(op.Payload)); err != nil {
		return fmt.Errorf("record op %q: %w", op.Kind, err)
	}
	return nil
}

// recordOps says whether ops are recorded for shipping (cluster mode).
func (l *Log) recordOps() bool { return l.cfg.Replicator != nil }
