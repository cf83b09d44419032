package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

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

var settingsSchema = []string{
	`CREATE TABLE IF NOT EXISTS agent_settings (
		beam_id                   TEXT PRIMARY KEY,
		require_sender_signatures INTEGER NOT NULL DEFAULT 0
	)`,
}

// putSettings writes a's settings row.
func putSettings(ctx context.Context, tx dbtx, a *Agent) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO agent_settings (beam_id, require_sender_signatures) VALUES (?, ?)
		ON CONFLICT(beam_id) DO UPDATE SET require_sender_signatures = excluded.require_sender_signatures`,
		a.BeamID, a.RequireSenderSignatures); err != nil {
		return fmt.Errorf("write settings of %s: %w", a.BeamID, err)
	}
	return nil
}

// loadSettings applies the stored settings to the loaded agents.
func loadSettings(ctx context.Context, db *sqlx.DB, byID map[string]*Agent) error {
	var rows []struct {
		BeamID  string `db:"beam_id"`
		Require bool   `db:"require_sender_signatures"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT beam_id, require_sender_signatures FROM agent_settings`); err != nil {
		return fmt.Errorf("registry: load settings: %w", err)
	}
	for _, row := range rows {
		if a, ok := byID[row.BeamID]; ok {
			a.RequireSenderSignatures = row.Require
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
		return nil, errf(http.StatusBadRequest, code, "%s must be true or false", name)
	}
	return &b, nil
}
