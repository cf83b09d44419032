package tracing

import (
	"go/ast"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/beamdir/beam/internal/srcscan"
	"github.com/stretchr/testify/require"
)

// logTables are the tables of the log and of its projections: only tracing
// may hold SQL on them. Everyone else reads and writes through the Log's
// methods.
var logTables = []string{"intent_trace_events", "intent_log", "beam_messages", "beam_mesh", "projection_seq"}

var (
	// sqlNamingTable matches a table name where SQL puts one: after FROM,
	// JOIN, INTO, UPDATE, TABLE, INDEX … ON, EXISTS, in any case.
	sqlNamingTable = regexp.MustCompile(`(?i)\b(from|join|into|update|table|on|exists)\s+(` + strings.Join(logTables, "|") + `)\b`)
	// sqlKeyword matches an upper-case SQL keyword, as this module writes
	// its SQL.
	sqlKeyword = regexp.MustCompile(`\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|WHERE|CREATE|DROP|ALTER|REPLACE)\b`)
	// logTableWord matches any of the tables as a word.
	logTableWord = regexp.MustCompile(`\b(` + strings.Join(logTables, "|") + `)\b`)
)

// logSQL reports whether a Go string literal's value looks like SQL on the
// log's tables: a table name in a place only SQL puts it, a table name next
// to an SQL keyword, or a bare table name (a constant spliced into a query).
func logSQL(s string) bool {
	if slices.Contains(logTables, strings.TrimSpace(s)) {
		return true
	}
	if !logTableWord.MatchString(s) {
		return false
	}
	return sqlNamingTable.MatchString(s) || sqlKeyword.MatchString(s)
}

func TestLogSQLDetector(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"SELECT nonce FROM intent_log WHERE status = ?",
		"select * from beam_messages",
		"DELETE FROM intent_trace_events",
		"INSERT INTO beam_mesh(id) VALUES(?)",
		"WHERE NOT EXISTS (SELECT 1 FROM intent_log i WHERE i.nonce = o.nonce)",
		"UPDATE beam_messages SET status = ?",
		"intent_trace_events",
		" beam_messages ",
		"CREATE INDEX x ON intent_log(status)",
	} {
		require.True(t, logSQL(s), "%q is SQL on a log table", s)
	}
	for _, s := range []string{
		"Reads a Beam TypeScript directory or message-bus SQLite database (tables intent_log,",
		"intent_trace_events, beam_messages), normalizes legacy statuses and stages, and appends",
		"SELECT key FROM intent_bus_kv",
		"the message rows of the log",
		"intent_logger",
	} {
		require.False(t, logSQL(s), "%q is not SQL on a log table", s)
	}
}

// TestNoLogSQLOutsideTracing keeps every query on the log's tables inside
// this package: no non-test Go file elsewhere in the module holds a string
// literal with SQL on them (see logSQL), so reads keep their indexes and
// writes keep the single writer.
func TestNoLogSQLOutsideTracing(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	var found []string
	err = srcscan.Files(root, []string{"tracing"}, func(rel string, fset *token.FileSet, f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && logSQL(s) {
				p := fset.Position(lit.Pos())
				found = append(found, rel+":"+strconv.Itoa(p.Line))
			}
			return true
		})
	})
	require.NoError(t, err)
	require.Empty(t, found, "SQL on the log's tables (%s) outside tracing: add a query method to tracing and call it", strings.Join(logTables, ", "))
}
