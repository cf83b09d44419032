package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// The tables of the job bus's registry-like state. Job state is never here:
// it is in the log.
const schema = `
CREATE TABLE IF NOT EXISTS intent_bus_keys(
  key_hash   TEXT PRIMARY KEY,
  owner      TEXT NOT NULL,
  created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS intent_bus_kv(
  scope      TEXT NOT NULL,
  key        TEXT NOT NULL,
  value      TEXT NOT NULL,
  expires_at REAL NOT NULL,
  PRIMARY KEY(scope, key)
);
CREATE TABLE IF NOT EXISTS intent_bus_idempotency(
  scope      TEXT NOT NULL,
  key        TEXT NOT NULL,
  body_hash  TEXT NOT NULL,
  status     INTEGER NOT NULL,
  response   TEXT NOT NULL,
  created_at REAL NOT NULL,
  PRIMARY KEY(scope, key)
);
CREATE TABLE IF NOT EXISTS intent_bus_tombstones(
  job_id     TEXT PRIMARY KEY,
  deleted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS intent_bus_nonces(
  key_digest TEXT NOT NULL,
  nonce      TEXT NOT NULL,
  expires_at INTEGER NOT NULL,
  PRIMARY KEY(key_digest, nonce)
);
`

type keyRow struct {
	Hash      string  `db:"key_hash"`
	Owner     string  `db:"owner"`
	CreatedAt float64 `db:"created_at"`
}

type kvRow struct {
	Scope     string  `db:"scope"`
	Key       string  `db:"key"`
	Value     string  `db:"value"`
	ExpiresAt float64 `db:"expires_at"`
}

type idemRow struct {
	Scope     string  `db:"scope"`
	Key       string  `db:"key"`
	BodyHash  string  `db:"body_hash"`
	Status    int     `db:"status"`
	Response  string  `db:"response"`
	CreatedAt float64 `db:"created_at"`
}

type nonceRow struct {
	Digest    string `db:"key_digest"`
	Nonce     string `db:"nonce"`
	ExpiresAt int64  `db:"expires_at"`
}

// loadTables creates the tables and reads them into memory.
func (s *Service) loadTables(ctx context.Context) (tomb map[string]bool, err error) {
	if _, err := s.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(schema)
		return err
	}); err != nil {
		return nil, fmt.Errorf("create intent bus tables: %w", err)
	}
	t, err := s.readTables(ctx)
	if err != nil {
		return nil, err
	}
	s.install(t)
	return t.tomb, nil
}

// tables is what the job bus keeps of its tables in memory.
type tables struct {
	keys   map[string]string
	kv     map[string]kvEntry
	idem   map[string]*idemEntry
	nonces []nonceRow
	tomb   map[string]bool
}

// readTables reads the job bus's tables.
func (s *Service) readTables(ctx context.Context) (*tables, error) {
	t := &tables{keys: map[string]string{}, kv: map[string]kvEntry{}, idem: map[string]*idemEntry{}}
	db := s.log.ReadDB()
	var keys []keyRow
	if err := db.SelectContext(ctx, &keys, `SELECT key_hash, owner, created_at FROM intent_bus_keys`); err != nil {
		return nil, fmt.Errorf("load tester keys: %w", err)
	}
	for _, k := range keys {
		t.keys[k.Hash] = k.Owner
	}
	var kvs []kvRow
	if err := db.SelectContext(ctx, &kvs, `SELECT scope, key, value, expires_at FROM intent_bus_kv`); err != nil {
		return nil, fmt.Errorf("load kv: %w", err)
	}
	for _, e := range kvs {
		t.kv[e.Scope+"\x00"+e.Key] = kvEntry{value: e.Value, expires: secsToMs(e.ExpiresAt)}
	}
	var idem []idemRow
	if err := db.SelectContext(ctx, &idem, `SELECT scope, key, body_hash, status, response, created_at FROM intent_bus_idempotency`); err != nil {
		return nil, fmt.Errorf("load idempotency keys: %w", err)
	}
	for _, e := range idem {
		t.idem[e.Scope+"\x00"+e.Key] = &idemEntry{hash: e.BodyHash, status: e.Status, body: []byte(e.Response),
			created: secsToMs(e.CreatedAt)}
	}
	if err := db.SelectContext(ctx, &t.nonces, `SELECT key_digest, nonce, expires_at FROM intent_bus_nonces WHERE expires_at > ?`,
		s.clock().Unix()); err != nil {
		return nil, fmt.Errorf("load nonces: %w", err)
	}
	var ids []string
	if err := db.SelectContext(ctx, &ids, `SELECT job_id FROM intent_bus_tombstones`); err != nil {
		return nil, fmt.Errorf("load tombstones: %w", err)
	}
	t.tomb = make(map[string]bool, len(ids))
	for _, id := range ids {
		t.tomb[id] = true
	}
	return t, nil
}

// install puts tables in memory (at Open, or under s.mu): idempotency
// keys of requests in flight stay.
func (s *Service) install(t *tables) {
	for k, e := range s.idem {
		if e.pending {
			t.idem[k] = e
		}
	}
	s.keys, s.kv, s.idem = t.keys, t.kv, t.idem
	for _, n := range t.nonces {
		s.nonces.Use(n.Digest+"\x00"+n.Nonce, time.Time{}, time.Unix(n.ExpiresAt, 0))
	}
}

func secsToMs(f float64) int64 { return int64(f * 1000) }

func msToSecs(ms int64) float64 { return float64(ms) / 1000 }
