package tracing

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every connection of the log runs with its page cache capped, so a large
// database does not make the process hold more than the caps in pages.
func TestPageCachesAreBounded(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	cacheKiB := func(c *sql.Conn) int {
		var v int
		require.NoError(t, c.QueryRowContext(ctx, `PRAGMA cache_size`).Scan(&v))
		return -v // negative: KiB
	}

	w, err := b.log.wdb.Conn(ctx)
	require.NoError(t, err)
	require.Equal(t, writerCacheKiB, cacheKiB(w))
	require.NoError(t, w.Close())

	// Hold every reader at once, so each pooled connection is asked.
	var readers []*sql.Conn
	for range b.log.cfg.ReadConns {
		c, err := b.log.rdb.Conn(ctx)
		require.NoError(t, err)
		readers = append(readers, c)
	}
	for _, c := range readers {
		require.Equal(t, readerCacheKiB, cacheKiB(c))
	}
	for _, c := range readers {
		require.NoError(t, c.Close())
	}
	require.Equal(t, b.log.cfg.ReadConns, b.log.rdb.Stats().OpenConnections)
}
