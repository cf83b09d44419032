package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/tracing"
)

// The job bus's tables (tester keys, KV, idempotency keys, tombstones,
// used nonces) are written through ops (tracing.RegisterOp): in cluster
// mode the log ships them with its events, and a node that takes the log
// over applies them with the same functions (tracing.Log.Import); the
// Service's Reload then reads them into memory.

// The kinds of the job bus's ops.
const (
	opKeyAdd       = "jobs.key.add"
	opKeyRevoke    = "jobs.key.revoke"
	opKVSet        = "jobs.kv.set"
	opIdemPut      = "jobs.idempotency.put"
	opTombstones   = "jobs.tombstones.add"
	opNoncePut     = "jobs.nonce.put"
	opExpire       = "jobs.expire"
	opNoncesExpire = "jobs.nonces.expire"
	opClear        = "jobs.clear"
)

// tableOp is the payload of every job bus op; each kind reads its fields.
type tableOp struct {
	Hash     string   `json:"hash,omitempty"`
	Owner    string   `json:"owner,omitempty"`
	Digest   string   `json:"digest,omitempty"`
	Scope    string   `json:"scope,omitempty"`
	Key      string   `json:"key,omitempty"`
	Value    string   `json:"value,omitempty"`
	BodyHash string   `json:"bodyHash,omitempty"`
	Status   int      `json:"status,omitempty"`
	Response string   `json:"response,omitempty"`
	Nonce    string   `json:"nonce,omitempty"`
	IDs      []string `json:"ids,omitempty"`
	// At is a time in unix seconds (created, deleted); Until an expiry
	// (unix seconds, whole for nonces); Before and IdemBefore the cut-offs
	// of a cleanup.
	At         float64 `json:"at,omitempty"`
	Until      float64 `json:"until,omitempty"`
	Before     float64 `json:"before,omitempty"`
	IdemBefore float64 `json:"idemBefore,omitempty"`
}

var tableOps = map[string]func(tx *sqlx.Tx, o *tableOp) error{
	opKeyAdd: func(tx *sqlx.Tx, o *tableOp) error {
		_, err := tx.Exec(`INSERT INTO intent_bus_keys(key_hash, owner, created_at) VALUES(?,?,?)`, o.Hash, o.Owner, o.At)
		return err
	},
	opKeyRevoke: func(tx *sqlx.Tx, o *tableOp) error {
		return execAll(tx, []string{`DELETE FROM intent_bus_keys WHERE key_hash = ?`,
			`DELETE FROM intent_bus_idempotency WHERE scope = ?`, `DELETE FROM intent_bus_nonces WHERE key_digest = ?`},
			o.Hash, o.Digest, o.Digest)
	},
	opKVSet: func(tx *sqlx.Tx, o *tableOp) error {
		_, err := tx.Exec(`INSERT OR REPLACE INTO intent_bus_kv(scope, key, value, expires_at) VALUES(?,?,?,?)`,
			o.Scope, o.Key, o.Value, o.Until)
		return err
	},
	opIdemPut: func(tx *sqlx.Tx, o *tableOp) error {
		_, err := tx.Exec(`INSERT OR REPLACE INTO intent_bus_idempotency(scope, key, body_hash, status, response, created_at)
			VALUES(?,?,?,?,?,?)`, o.Scope, o.Key, o.BodyHash, o.Status, o.Response, o.At)
		return err
	},
	opTombstones: func(tx *sqlx.Tx, o *tableOp) error {
		st, err := tx.Prepare(`INSERT OR REPLACE INTO intent_bus_tombstones(job_id, deleted_at) VALUES(?, ?)`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, id := range o.IDs {
			if _, err := st.Exec(id, o.At); err != nil {
				return err
			}
		}
		return nil
	},
	opNoncePut: func(tx *sqlx.Tx, o *tableOp) error {
		_, err := tx.Exec(`INSERT OR REPLACE INTO intent_bus_nonces(key_digest, nonce, expires_at) VALUES(?, ?, ?)`,
			o.Digest, o.Nonce, int64(o.Until))
		return err
	},
	opExpire: func(tx *sqlx.Tx, o *tableOp) error {
		return execAll(tx, []string{`DELETE FROM intent_bus_kv WHERE expires_at <= ?`,
			`DELETE FROM intent_bus_idempotency WHERE created_at <= ?`}, o.Before, o.IdemBefore)
	},
	opNoncesExpire: func(tx *sqlx.Tx, o *tableOp) error {
		_, err := tx.Exec(`DELETE FROM intent_bus_nonces WHERE expires_at <= ?`, int64(o.Before))
		return err
	},
	opClear: func(tx *sqlx.Tx, _ *tableOp) error {
		return execAll(tx, []string{`DELETE FROM intent_bus_kv`, `DELETE FROM intent_bus_idempotency`,
			`DELETE FROM intent_bus_nonces`})
	},
}

func init() {
	for kind, fn := range tableOps {
		tracing.RegisterOp(kind, func(tx *sqlx.Tx, payload []byte) error {
			var o tableOp
			if err := json.Unmarshal(payload, &o); err != nil {
				return fmt.Errorf("decode: %w", err)
			}
			err := fn(tx, &o)
			if err != nil && strings.Contains(err.Error(), "no such table") {
				// Imported on a node whose job bus never opened: make the
				// tables and apply again.
				if _, serr := tx.Exec(schema); serr != nil {
					return serr
				}
				err = fn(tx, &o)
			}
			return err
		})
	}
}

// execAll runs each query with the argument of the same index (none when
// args is shorter).
func execAll(tx *sqlx.Tx, qs []string, args ...any) error {
	for i, q := range qs {
		var a []any
		if i < len(args) {
			a = args[i : i+1]
		}
		if _, err := tx.Exec(q, a...); err != nil {
			return err
		}
	}
	return nil
}

// op encodes a job bus op.
func op(kind string, o tableOp) tracing.Op {
	b, err := json.Marshal(o)
	if err != nil {
		panic(fmt.Sprintf("encode op %s: %v", kind, err)) // strings and numbers only
	}
	return tracing.Op{Kind: kind, Payload: b}
}

func nonceOp(n *signedNonce) tracing.Op {
	return op(opNoncePut, tableOp{Digest: n.digest, Nonce: n.nonce, Until: float64(n.expires)})
}

// Reload reads the job bus's tables into memory again, after ops were
// imported from a log this node took over (tracing.Log.Import): tester
// keys, KV values, idempotency keys and used nonces. Jobs are not read
// here: they are adopted from the imported events.
func (s *Service) Reload(ctx context.Context) error {
	t, err := s.readTables(ctx)
	if err != nil {
		return fmt.Errorf("reload intent bus tables: %w", err)
	}
	s.mu.Lock()
	s.install(t)
	s.mu.Unlock()
	return nil
}
