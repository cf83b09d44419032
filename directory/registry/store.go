package registry

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/agents/wire"
)

// nonceTTL is how long a used nonce is remembered. It covers the whole
// ±5 minute timestamp window, so a signed request can never be replayed.
const nonceTTL = 10 * time.Minute

var schema = []string{
	`CREATE TABLE IF NOT EXISTS agents (
		beam_id           TEXT PRIMARY KEY,
		org               TEXT NOT NULL,
		personal          INTEGER NOT NULL DEFAULT 0,
		display_name      TEXT NOT NULL,
		capabilities      TEXT NOT NULL DEFAULT '[]',
		public_key        TEXT NOT NULL,
		api_key_hash      TEXT NOT NULL DEFAULT '',
		email             TEXT NOT NULL DEFAULT '',
		email_verified    INTEGER NOT NULL DEFAULT 0,
		description       TEXT NOT NULL DEFAULT '',
		logo_url          TEXT NOT NULL DEFAULT '',
		website           TEXT NOT NULL DEFAULT '',
		trust_score       REAL NOT NULL DEFAULT 0.3,
		verified          INTEGER NOT NULL DEFAULT 0,
		verification_tier TEXT NOT NULL DEFAULT 'basic',
		visibility        TEXT NOT NULL DEFAULT 'public',
		http_endpoint     TEXT NOT NULL DEFAULT '',
		dh_public_key     TEXT NOT NULL DEFAULT '',
		created_at        INTEGER NOT NULL,
		updated_at        INTEGER NOT NULL,
		last_seen         INTEGER NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS agents_org ON agents(org)`,
	`CREATE TABLE IF NOT EXISTS agent_keys (
		beam_id    TEXT NOT NULL,
		public_key TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		revoked_at INTEGER,
		UNIQUE(beam_id, public_key)
	)`,
	`CREATE TABLE IF NOT EXISTS intent_acls (
		id             INTEGER PRIMARY KEY AUTOINCREMENT,
		target_beam_id TEXT NOT NULL,
		intent_type    TEXT NOT NULL,
		allowed_from   TEXT NOT NULL,
		effect         TEXT NOT NULL DEFAULT 'allow' CHECK (effect IN ('allow', 'deny')),
		created_at     INTEGER NOT NULL,
		created_by     TEXT NOT NULL DEFAULT '',
		UNIQUE(target_beam_id, intent_type, allowed_from)
	)`,
	`CREATE INDEX IF NOT EXISTS intent_acls_target ON intent_acls(target_beam_id, intent_type)`,
	`CREATE TABLE IF NOT EXISTS used_nonces (
		scope      TEXT NOT NULL,
		nonce      TEXT NOT NULL,
		expires_at INTEGER NOT NULL,
		PRIMARY KEY (scope, nonce)
	)`,
	`CREATE INDEX IF NOT EXISTS used_nonces_expiry ON used_nonces(expires_at)`,
	`CREATE TABLE IF NOT EXISTS audit_log (
		seq     INTEGER PRIMARY KEY AUTOINCREMENT,
		at      INTEGER NOT NULL,
		action  TEXT NOT NULL,
		actor   TEXT NOT NULL,
		target  TEXT NOT NULL,
		details TEXT NOT NULL DEFAULT '{}'
	)`,
	`CREATE INDEX IF NOT EXISTS audit_log_target ON audit_log(target, seq)`,
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMicro(v).UTC()
}

// doLocal runs fn in the log's writer transaction of this node only (the
// schema and last_seen, which each node keeps for itself).
func (r *Registry) doLocal(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	_, err := r.log.Do(ctx, fn)
	return err
}

func (r *Registry) migrate(ctx context.Context) error {
	err := r.doLocal(ctx, func(tx *sqlx.Tx) error {
		for _, stmt := range append(append(schema, settingsSchema...), replicaSchema...) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("%.40s…: %w", stmt, err)
			}
		}
		if err := migrateSettings(ctx, tx); err != nil {
			return err
		}
		return migrateOrgs(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("registry: create tables: %w", err)
	}
	return nil
}

type agentRow struct {
	BeamID           string  `db:"beam_id"`
	Org              string  `db:"org"`
	Personal         bool    `db:"personal"`
	DisplayName      string  `db:"display_name"`
	Capabilities     string  `db:"capabilities"`
	PublicKey        string  `db:"public_key"`
	APIKeyHash       string  `db:"api_key_hash"`
	Email            string  `db:"email"`
	EmailVerified    bool    `db:"email_verified"`
	Description      string  `db:"description"`
	LogoURL          string  `db:"logo_url"`
	Website          string  `db:"website"`
	TrustScore       float64 `db:"trust_score"`
	Verified         bool    `db:"verified"`
	VerificationTier string  `db:"verification_tier"`
	Visibility       string  `db:"visibility"`
	HTTPEndpoint     string  `db:"http_endpoint"`
	DHPublicKey      string  `db:"dh_public_key"`
	CreatedAt        int64   `db:"created_at"`
	UpdatedAt        int64   `db:"updated_at"`
	LastSeen         int64   `db:"last_seen"`
}

type keyRow struct {
	BeamID    string        `db:"beam_id"`
	PublicKey string        `db:"public_key"`
	CreatedAt int64         `db:"created_at"`
	RevokedAt sql.NullInt64 `db:"revoked_at"`
}

type ruleRow struct {
	ID          int64  `db:"id"`
	Target      string `db:"target_beam_id"`
	IntentType  string `db:"intent_type"`
	AllowedFrom string `db:"allowed_from"`
	Effect      string `db:"effect"`
	CreatedAt   int64  `db:"created_at"`
	CreatedBy   string `db:"created_by"`
}

func (row ruleRow) rule() Rule {
	return Rule{ID: row.ID, Target: row.Target, IntentType: row.IntentType, AllowedFrom: row.AllowedFrom,
		Effect: row.Effect, CreatedAt: fromMicros(row.CreatedAt), CreatedBy: row.CreatedBy}
}

func rowOf(a *Agent, now time.Time) agentRow {
	caps, _ := json.Marshal(a.Capabilities) // []string always marshals
	if a.Capabilities == nil {
		caps = []byte("[]")
	}
	return agentRow{
		BeamID: a.BeamID, Org: a.Org, Personal: a.Personal, DisplayName: a.DisplayName,
		Capabilities: string(caps), PublicKey: a.PublicKeyB64, APIKeyHash: a.apiKeyHash,
		Email: a.Email, EmailVerified: a.EmailVerified, Description: a.Description,
		LogoURL: a.LogoURL, Website: a.Website, TrustScore: a.TrustScore(now), Verified: a.Verified,
		VerificationTier: a.VerificationTier, Visibility: a.Visibility, HTTPEndpoint: a.HTTPEndpoint,
		DHPublicKey: a.DHPublicKey, CreatedAt: micros(a.CreatedAt), UpdatedAt: micros(a.UpdatedAt),
		LastSeen: micros(a.LastSeen),
	}
}

func (row agentRow) agent() (*Agent, error) {
	pub, err := wire.ParsePublicKey(row.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("agent %s: public key: %w", row.BeamID, err)
	}
	var caps []string
	if err := json.Unmarshal([]byte(row.Capabilities), &caps); err != nil {
		return nil, fmt.Errorf("agent %s: capabilities: %w", row.BeamID, err)
	}
	if caps == nil {
		caps = []string{}
	}
	return &Agent{
		BeamID: row.BeamID, Org: row.Org, Personal: row.Personal, DisplayName: row.DisplayName,
		Capabilities: caps, PublicKey: pub, PublicKeyB64: row.PublicKey, apiKeyHash: row.APIKeyHash,
		Email: row.Email, EmailVerified: row.EmailVerified, Description: row.Description,
		LogoURL: row.LogoURL, Website: row.Website, Verified: row.Verified,
		VerificationTier: row.VerificationTier, Visibility: row.Visibility,
		HTTPEndpoint: row.HTTPEndpoint, DHPublicKey: row.DHPublicKey,
		CreatedAt: fromMicros(row.CreatedAt), UpdatedAt: fromMicros(row.UpdatedAt),
		LastSeen: fromMicros(row.LastSeen),
	}, nil
}

// load reads every agent, key and rule into memory.
func (r *Registry) load(ctx context.Context) error {
	db := r.log.ReadDB()
	var rows []agentRow
	if err := db.SelectContext(ctx, &rows, `SELECT * FROM agents`); err != nil {
		return fmt.Errorf("registry: load agents: %w", err)
	}
	var keys []keyRow
	if err := db.SelectContext(ctx, &keys,
		`SELECT beam_id, public_key, created_at, revoked_at FROM agent_keys ORDER BY created_at, rowid`); err != nil {
		return fmt.Errorf("registry: load keys: %w", err)
	}
	var rules []ruleRow
	if err := db.SelectContext(ctx, &rules,
		`SELECT id, target_beam_id, intent_type, allowed_from, effect, created_at, created_by FROM intent_acls ORDER BY id`); err != nil {
		return fmt.Errorf("registry: load acls: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	byID := map[string]*Agent{}
	for _, row := range rows {
		a, err := row.agent()
		if err != nil {
			r.lg.Warn("skipping unreadable agent row", "err", err)
			continue
		}
		byID[a.BeamID] = a
	}
	if err := loadSettings(ctx, db, byID); err != nil {
		return err
	}
	for _, k := range keys {
		a, ok := byID[k.BeamID]
		if !ok {
			continue
		}
		key := Key{PublicKey: k.PublicKey, CreatedAt: fromMicros(k.CreatedAt)}
		if k.RevokedAt.Valid {
			key.RevokedAt = fromMicros(k.RevokedAt.Int64)
		}
		a.Keys = append(a.Keys, key)
	}
	for id, a := range byID {
		if len(a.Keys) == 0 {
			a.Keys = []Key{{PublicKey: a.PublicKeyB64, CreatedAt: a.CreatedAt}}
		}
		r.agents[id] = newEntry(a)
	}
	for _, row := range rules {
		rule := row.rule()
		r.rules[rule.Target] = append(r.rules[rule.Target], rule)
		r.ruleBy[rule.ID] = rule
	}
	r.lg.Debug("registry loaded", "agents", len(r.agents), "rules", len(rules))
	return nil
}

const upsertAgentSQL = `INSERT INTO agents (
	beam_id, org, personal, display_name, capabilities, public_key, api_key_hash, email, email_verified,
	description, logo_url, website, trust_score, verified, verification_tier, visibility, http_endpoint,
	dh_public_key, created_at, updated_at, last_seen
) VALUES (
	:beam_id, :org, :personal, :display_name, :capabilities, :public_key, :api_key_hash, :email, :email_verified,
	:description, :logo_url, :website, :trust_score, :verified, :verification_tier, :visibility, :http_endpoint,
	:dh_public_key, :created_at, :updated_at, :last_seen
) ON CONFLICT(beam_id) DO UPDATE SET
	org = excluded.org, personal = excluded.personal, display_name = excluded.display_name,
	capabilities = excluded.capabilities, public_key = excluded.public_key, api_key_hash = excluded.api_key_hash,
	email = excluded.email, email_verified = excluded.email_verified, description = excluded.description,
	logo_url = excluded.logo_url, website = excluded.website, trust_score = excluded.trust_score,
	verified = excluded.verified, verification_tier = excluded.verification_tier,
	visibility = excluded.visibility, http_endpoint = excluded.http_endpoint,
	dh_public_key = excluded.dh_public_key, updated_at = excluded.updated_at,
	last_seen = MAX(agents.last_seen, excluded.last_seen)`

func putAgent(ctx context.Context, tx dbtx, a *Agent, now time.Time) error {
	if _, err := tx.NamedExecContext(ctx, upsertAgentSQL, rowOf(a, now)); err != nil {
		return fmt.Errorf("write agent %s: %w", a.BeamID, err)
	}
	return putSettings(ctx, tx, a)
}

// putKeys makes agent_keys match a.Keys.
func putKeys(ctx context.Context, tx dbtx, a *Agent) error {
	for _, k := range a.Keys {
		var revoked any
		if k.Revoked() {
			revoked = micros(k.RevokedAt)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO agent_keys (beam_id, public_key, created_at, revoked_at)
			VALUES (?, ?, ?, ?) ON CONFLICT(beam_id, public_key) DO UPDATE SET revoked_at = excluded.revoked_at`,
			a.BeamID, k.PublicKey, micros(k.CreatedAt), revoked); err != nil {
			return fmt.Errorf("write key of %s: %w", a.BeamID, err)
		}
	}
	return nil
}

// useNonce records nonce for scope, or fails with NONCE_REUSED.
func useNonce(ctx context.Context, tx dbtx, scope, nonce string, now time.Time) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM used_nonces WHERE expires_at < ?`, micros(now)); err != nil {
		return fmt.Errorf("prune nonces: %w", err)
	}
	res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO used_nonces (scope, nonce, expires_at) VALUES (?, ?, ?)`,
		scope, nonce, micros(now.Add(nonceTTL)))
	if err != nil {
		return fmt.Errorf("record nonce: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("record nonce: %w", err)
	}
	if n == 0 {
		return errNonceReused
	}
	return nil
}

// audit writes one audit_log row.
func audit(ctx context.Context, tx dbtx, now time.Time, action, actor, target string, details map[string]any) error {
	if details == nil {
		details = map[string]any{}
	}
	b, err := json.Marshal(details)
	if err != nil {
		return fmt.Errorf("audit details: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO audit_log (at, action, actor, target, details) VALUES (?, ?, ?, ?, ?)`,
		micros(now), action, actor, target, string(b)); err != nil {
		return fmt.Errorf("write audit row: %w", err)
	}
	return nil
}
