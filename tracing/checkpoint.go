package tracing

import (
	"context"
	"fmt"
	"net/url"

	"github.com/jmoiron/sqlx"
)

// WAL checkpoints run off the writer's commit path: the write connection
// has wal_autocheckpoint off, and a checkpointer goroutine with its own
// connection copies the WAL into the database file (PRAGMA
// wal_checkpoint(PASSIVE), which never blocks the writer) while the writer
// goes on committing. A checkpoint from that connection syncs the WAL before
// copying and the database file after, as the writer's would, so
// durability does not change: every commit is still synced by the writer.
//
// A passive checkpoint does not restart the WAL while commits keep coming,
// so the WAL could grow without bound under sustained load; once it holds
// walRestartPages pages, the writer itself restarts it between two batches
// (PRAGMA wal_checkpoint(RESTART): by then there is little left to copy).
const (
	// checkpointEvery is how many commits pass between two passive
	// checkpoint requests.
	checkpointEvery = 32
	// walRestartPages is the WAL size (pages) at which the writer restarts
	// the WAL itself. 4 MB: a commit that extends the WAL file pays for the
	// new blocks in its fsync (on ext4 about a fifth of a one-event
	// commit's CPU), and after a restart commits overwrite blocks the file
	// already has, so the sooner the first restart, the sooner commits stop
	// paying for growth.
	walRestartPages = 1024
)

// checkpointer owns the checkpoint connection.
type checkpointer struct {
	db   *sqlx.DB
	wake chan struct{} // capacity 1
	done chan struct{}
	// every and restartPages are checkpointEvery and walRestartPages
	// (tests lower them before the first append).
	every        int
	restartPages int64
	commits      int // owned by the writer: commits since the last request
}

func openCheckpointer(path, syncMode string) (*checkpointer, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "synchronous("+syncMode+")")
	q.Add("_pragma", "cache_size(-2048)")
	db, err := sqlx.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open checkpoint connection: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	return &checkpointer{db: db, wake: make(chan struct{}, 1), done: make(chan struct{}),
		every: checkpointEvery, restartPages: walRestartPages}, nil
}

// committed is called by the writer after every commit; it wakes the
// checkpointer every checkpointEvery commits.
func (c *checkpointer) committed() {
	c.commits++
	if c.commits < c.every {
		return
	}
	c.commits = 0
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// runCheckpointer checkpoints until wake is closed. It sets needRestart
// when the WAL has grown to restartPages pages.
func (l *Log) runCheckpointer() {
	c := l.ckpt
	defer close(c.done)
	ctx := context.Background()
	for range c.wake {
		var busy, pages, copied int64
		err := c.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &pages, &copied)
		if err != nil {
			l.logger.Warn("log WAL checkpoint failed", "err", err)
			continue
		}
		if pages >= c.restartPages {
			l.needRestart.Store(true)
		}
	}
}

// restartWAL, run by the writer between batches when the WAL has grown
// large, checkpoints what is left and makes the next commit write the WAL
// from its start. It waits (busy_timeout) for readers still using the WAL.
func (l *Log) restartWAL() {
	l.walRestarts.Add(1)
	var busy, pages, copied int64
	err := l.wdb.QueryRowContext(context.Background(), `PRAGMA wal_checkpoint(RESTART)`).Scan(&busy, &pages, &copied)
	if err != nil {
		l.logger.Warn("log WAL restart failed", "err", err)
		return
	}
	if busy != 0 {
		l.logger.Debug("log WAL restart incomplete: readers still use the WAL", "pages", pages, "copied", copied)
	}
}

func (c *checkpointer) close() error {
	close(c.wake)
	<-c.done
	return c.db.Close()
}
