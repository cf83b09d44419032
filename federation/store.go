package federation

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/tracing"
)

const createStore = `
CREATE TABLE IF NOT EXISTS federation_peers(
  domain       TEXT PRIMARY KEY,
  url          TEXT NOT NULL,
  public_key   TEXT NOT NULL,
  added_at     INTEGER NOT NULL,
  last_contact INTEGER
);
CREATE TABLE IF NOT EXISTS federation_seen(
  jti        TEXT PRIMARY KEY,
  peer       TEXT NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS federation_seen_expires ON federation_seen(expires_at);
`

// errReplay is returned by markSeen for a jti already recorded.
var errReplay = errors.New("jti already seen")

// peerStore keeps pinned peers and seen message ids in the log's file.
type peerStore struct {
	log *tracing.Log
}

func (s peerStore) load(ctx context.Context) ([]Peer, error) {
	rows, err := s.log.ReadDB().QueryContext(ctx, `SELECT domain, url, public_key, added_at, last_contact FROM federation_peers ORDER BY domain`)
	if err != nil {
		return nil, fmt.Errorf("load peers: %w", err)
	}
	defer rows.Close()
	var out []Peer
	for rows.Next() {
		var p Peer
		var key string
		var added int64
		var last sql.NullInt64
		if err := rows.Scan(&p.Domain, &p.URL, &key, &added, &last); err != nil {
			return nil, fmt.Errorf("load peers: %w", err)
		}
		pub, err := parseKey(key)
		if err != nil {
			return nil, fmt.Errorf("load peer %s: %w", p.Domain, err)
		}
		p.PublicKey = pub
		p.AddedAt = time.UnixMicro(added).UTC()
		if last.Valid {
			p.LastContact = time.UnixMicro(last.Int64).UTC()
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func (s peerStore) put(ctx context.Context, p Peer) error {
	_, err := s.log.Do(ctx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`INSERT INTO federation_peers(domain, url, public_key, added_at) VALUES (?,?,?,?)
 ON CONFLICT(domain) DO UPDATE SET url = excluded.url, public_key = excluded.public_key,
   added_at = CASE WHEN public_key = excluded.public_key THEN added_at ELSE excluded.added_at END`,
			p.Domain, p.URL, EncodeKey(p.PublicKey), us(p.AddedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("store peer %s: %w", p.Domain, err)
	}
	return nil
}

func (s peerStore) remove(ctx context.Context, domain string) (bool, error) {
	var n int64
	_, err := s.log.Do(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.Exec(`DELETE FROM federation_peers WHERE domain = ?`, domain)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("remove peer %s: %w", domain, err)
	}
	return n > 0, nil
}

func (s peerStore) touch(ctx context.Context, contacts map[string]time.Time) error {
	if len(contacts) == 0 {
		return nil
	}
	_, err := s.log.Do(ctx, func(tx *sqlx.Tx) error {
		for d, t := range contacts {
			if _, err := tx.Exec(`UPDATE federation_peers SET last_contact = max(coalesce(last_contact, 0), ?) WHERE domain = ?`, us(t), d); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store last contact: %w", err)
	}
	return nil
}

// markSeen records a message id until it expires; errReplay when it was
// recorded before. Expired ids are pruned on the way.
func (s peerStore) markSeen(ctx context.Context, jti, peer string, exp, now time.Time) error {
	_, err := s.log.Do(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.Exec(`INSERT INTO federation_seen(jti, peer, expires_at) VALUES (?,?,?) ON CONFLICT(jti) DO NOTHING`,
			jti, peer, us(exp))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errReplay
		}
		_, err = tx.Exec(`DELETE FROM federation_seen WHERE rowid IN (SELECT rowid FROM federation_seen WHERE expires_at < ? LIMIT 64)`, us(now))
		return err
	})
	return unwrapFn(err)
}

// keyMatches reports whether two keys are equal.
func keyMatches(a, b ed25519.PublicKey) bool { return a.Equal(b) }

// normDomain lowercases and trims a domain from user input.
func normDomain(d string) string { return strings.ToLower(strings.TrimSpace(d)) }
