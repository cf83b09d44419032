package tracing

import (
	"context"
	"database/sql/driver"
	"fmt"
)

// txConn is the write connection as database/sql sees it: the driver's
// connection, except that a transaction's BEGIN IMMEDIATE, COMMIT and
// ROLLBACK run as statements prepared once. The driver compiles each of
// them anew for every transaction, which cost a one-event commit about a
// tenth of its CPU. Everything else goes to the driver's connection
// unchanged.
//
// A transaction begun here is the same SQLite transaction the driver's
// would be: the driver keeps no state of its own for one (its Tx runs the
// same three statements), and the write connection's DSN asks for
// immediate transactions (_txlock=immediate), which is what the prepared
// BEGIN says.
type txConn struct {
	driver.Conn
	pc driver.ConnPrepareContext
	ec driver.ExecerContext
	qc driver.QueryerContext
	bt driver.ConnBeginTx
	pg driver.Pinger
	sr driver.SessionResetter
	vd driver.Validator

	begin, commit, rollback driver.StmtExecContext
	stmts                   []driver.Stmt
	// closed, when set, is called by Close.
	closed func()
}

// newTxConn wraps dc, which must offer the interfaces database/sql uses
// of the sqlite driver's connections, and prepares the three statements.
func newTxConn(ctx context.Context, dc driver.Conn) (*txConn, error) {
	c := &txConn{Conn: dc}
	var ok [7]bool
	c.pc, ok[0] = dc.(driver.ConnPrepareContext)
	c.ec, ok[1] = dc.(driver.ExecerContext)
	c.qc, ok[2] = dc.(driver.QueryerContext)
	c.bt, ok[3] = dc.(driver.ConnBeginTx)
	c.pg, ok[4] = dc.(driver.Pinger)
	c.sr, ok[5] = dc.(driver.SessionResetter)
	c.vd, ok[6] = dc.(driver.Validator)
	for _, o := range ok {
		if !o {
			return nil, fmt.Errorf("driver connection %T lacks an interface the write connection needs", dc)
		}
	}
	for _, p := range []struct {
		dst *driver.StmtExecContext
		sql string
	}{{&c.begin, "BEGIN IMMEDIATE"}, {&c.commit, "COMMIT"}, {&c.rollback, "ROLLBACK"}} {
		es, err := prepareExec(ctx, c.pc, p.sql)
		if err != nil {
			c.closeStmts()
			return nil, err
		}
		c.stmts = append(c.stmts, es)
		*p.dst = es
	}
	return c, nil
}

func (c *txConn) closeStmts() {
	for _, s := range c.stmts {
		_ = s.Close()
	}
	c.stmts = nil
}

// Close implements driver.Conn.
func (c *txConn) Close() error {
	if c.closed != nil {
		c.closed()
	}
	c.closeStmts()
	return c.Conn.Close()
}

// BeginTx implements driver.ConnBeginTx. A transaction with options, or
// under a context that can end, is left to the driver, which knows how to
// end a BEGIN that a cancellation interrupts.
func (c *txConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts != (driver.TxOptions{}) || ctx.Done() != nil {
		return c.bt.BeginTx(ctx, opts)
	}
	if _, err := c.begin.ExecContext(ctx, nil); err != nil {
		return nil, err
	}
	return txEnd{c}, nil
}

// txEnd ends a transaction begun by txConn.BeginTx.
type txEnd struct{ c *txConn }

// Commit implements driver.Tx. A COMMIT that fails may leave the
// transaction open; database/sql expects the connection out of it, so it
// is rolled back then (a ROLLBACK outside a transaction only errs, and
// that error is not the one to report).
func (t txEnd) Commit() error {
	_, err := t.c.commit.ExecContext(context.Background(), nil)
	if err != nil {
		_, _ = t.c.rollback.ExecContext(context.Background(), nil)
	}
	return err
}

// Rollback implements driver.Tx.
func (t txEnd) Rollback() error {
	_, err := t.c.rollback.ExecContext(context.Background(), nil)
	return err
}

// PrepareContext implements driver.ConnPrepareContext.
func (c *txConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.pc.PrepareContext(ctx, query)
}

// ExecContext implements driver.ExecerContext.
func (c *txConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.ec.ExecContext(ctx, query, args)
}

// QueryContext implements driver.QueryerContext.
func (c *txConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.qc.QueryContext(ctx, query, args)
}

// Ping implements driver.Pinger.
func (c *txConn) Ping(ctx context.Context) error { return c.pg.Ping(ctx) }

// ResetSession implements driver.SessionResetter.
func (c *txConn) ResetSession(ctx context.Context) error { return c.sr.ResetSession(ctx) }

// IsValid implements driver.Validator.
func (c *txConn) IsValid() bool { return c.vd.IsValid() }
