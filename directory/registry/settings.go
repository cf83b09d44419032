package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/jmoiron/sqlx"
)

// Agent settings: what an agent asks of the directory about its own
// deliveries. They live in their own table, written with every agent row
// (putAgent), so a re-registered Beam ID starts from the defaults.
//
//	agent_settings(beam_id PK, require_sender_signatures)
//
// requireSenderSignatures (default false): intents to the agent must carry
// their sender's own signature end to end. A send the directory would have
// to attest (API key, bus key, beam/2 JWS turned into a beam/1 frame, a
// peer's vouching) is refused at send time instead. It is changed with
// PATCH /agents/{beamId}/config {"requireSenderSignatures": bool}; the
// signed config object then covers "requireSenderSignatures" too.
//
// acceptAttestedPipelineHops (default false): an agent that requires
// sender signatures still receives pipeline hops (/api/v1/mesh), which the
// directory attests because no agent signs them. Without it such an agent
// receives no pipeline hop: the envelope fails FORBIDDEN before delivery.
// It is changed like requireSenderSignatures, in the same request.

var settingsSchema = []string{
	`CREATE TABLE IF NOT EXISTS agent_settings (
		beam_id                   TEXT PRIMARY KEY,
		require_sender_signatures INTEGER NOT NULL DEFAULT 0,
		accept_attested_pipeline_hops INTEGER NOT NULL DEFAULT 0
	)`,
}

// migrateSettings adds the columns later versions added to a settings
// table an earlier version created.
func migrateSettings(ctx context.Context, tx *sqlx.Tx) error {
	var n int
	if err := tx.GetContext(ctx, &n, `SELECT COUNT(*) FROM pragma_table_info('agent_settings')
		WHERE name = 'accept_attested_pipeline_hops'`); err != nil {
		return fmt.Errorf("registry: read settings columns: %w", err)
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `ALTER TABLE agent_settings
		ADD COLUMN accept_attested_pipeline_hops INTEGER NOT NULL DEFAULT 0`); err != nil {
		return fmt.Errorf("registry: add settings column: %w", err)
	}
	return nil
}

// putSettings writes a's settings row.
func putSettings(ctx context.Context, tx dbtx, a *Agent) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO agent_settings (beam_id, require_sender_signatures, accept_attested_pipeline_hops)
		VALUES (?, ?, ?) ON CONFLICT(beam_id) DO UPDATE SET require_sender_signatures = excluded.require_sender_signatures,
		accept_attested_pipeline_hops = excluded.accept_attested_pipeline_hops`,
		a.BeamID, a.RequireSenderSignatures, a.AcceptAttestedPipelineHops); err != nil {
		return fmt.Errorf("write settings of %s: %w", a.BeamID, err)
	}
	return nil
}

// loadSettings applies the stored settings to the loaded agents.
func loadSettings(ctx context.Context, db *sqlx.DB, byID map[string]*Agent) error {
	var rows []struct {
		BeamID    string `db:"beam_id"`
		Require   bool   `db:"require_sender_signatures"`
		Pipelines bool   `db:"accept_attested_pipeline_hops"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT beam_id, require_sender_signatures, accept_attested_pipeline_hops
		FROM agent_settings`); err != nil {
		return fmt.Errorf("registry: load settings: %w", err)
	}
	for _, row := range rows {
		if a, ok := byID[row.BeamID]; ok {
			a.RequireSenderSignatures = row.Require
			a.AcceptAttestedPipelineHops = row.Pipelines
		}
	}
	return nil
}

// optBool reads an optional boolean field as a pointer (nil when absent).
func (f fields) optBool(code string, names ...string) (*bool, error) {
	v, name, ok := f.raw(names...)
	if !ok {
		return nil, nil
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return nil, httpjson.Errorf(http.StatusBadRequest, code, "%s must be true or false", name)
	}
	return &b, nil
}
