package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/buildinfo"
	"github.com/beamdir/beam/internal/dirlock"
	"github.com/beamdir/beam/tracing"
	"github.com/beamdir/beam/tracing/legacy"
)

// openLogForRead opens the log in dataDir read-only, for a command that
// only reads it; it may run while a server holds the directory.
func openLogForRead(ctx context.Context, dataDir string) (*tracing.Log, error) {
	return tracing.OpenReadOnly(ctx, filepath.Join(dataDir, "beam.db"))
}

// openLogForWrite takes the data-directory lock (refusing, before anything
// is opened, when a server or another command holds it) and opens the log.
// done closes the log and releases the lock.
func openLogForWrite(ctx context.Context, dataDir string) (lg *tracing.Log, done func(), err error) {
	lock, err := dirlock.Acquire(dataDir)
	if err != nil {
		return nil, nil, err
	}
	lg, err = tracing.Open(ctx, tracing.Config{Path: filepath.Join(dataDir, "beam.db")})
	if err != nil {
		_ = lock.Release()
		return nil, nil, err
	}
	return lg, func() {
		_ = lg.Close()
		_ = lock.Release()
	}, nil
}

// logCmdFlags is the flag set of an offline log command (compact usage, see
// newCompactCmdFlags) with its --data-dir flag registered.
func logCmdFlags(name, synopsis string, stderr io.Writer, dataDir *string, description ...string) *cmdFlags {
	fs := newCompactCmdFlags(name, synopsis, stderr, description...)
	fs.StringVar(dataDir, "data-dir", "./beam-data", "directory that holds the log")
	return fs
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var dataDir string
	fs := logCmdFlags("beam replay", "beam replay [--data-dir DIR]", stderr, &dataDir,
		"Drops the projections (intents, bus messages, …) and refolds them from the log,",
		"then refolds the federation outbox rows from their steps in the log.",
		"Run it while the directory is stopped; it refuses while a server holds --data-dir.")
	if err := fs.parse(args, 0, anyArgs); err != nil {
		return err
	}
	lg, done, err := openLogForWrite(ctx, dataDir)
	if err != nil {
		return err
	}
	defer done()
	st, err := lg.Rebuild(ctx)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	rate := 0.0
	if st.Duration > 0 {
		rate = float64(st.Events) / st.Duration.Seconds()
	}
	fmt.Fprintf(stdout, "replayed %d events into %d intents and %d bus messages in %s (%.0f events/s)\n",
		st.Events, st.Intents, st.Messages, st.Duration.Round(time.Millisecond), rate)
	rows, err := federation.RebuildOutbox(ctx, lg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "refolded %d federation outbox rows from their steps\n", rows)
	return nil
}

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var dataDir, base, token string
	var asJSON bool
	fs := logCmdFlags("beam trace", "beam trace [--data-dir DIR | --url URL [--admin-token T]] [--json] NONCE|JOB-ID|ENVELOPE-ID", stderr, &dataDir,
		"Prints the events of one intent, Intent Protocol job or pipeline envelope, in order, with",
		"the time since the previous event and each event's details. The id is taken as printed",
		"(a job's or envelope's id with or without its job: or mesh: prefix). It reads the log in",
		"--data-dir (alongside a running server), or with --url asks a running directory (operator",
		"token: --admin-token, BEAM_ADMIN_TOKEN or the admin.token of --data-dir); both print the same.")
	fs.BoolVar(&asJSON, "json", false, "print the events as JSON lines")
	fs.StringVar(&base, "url", "", "base URL of a running directory to ask instead of reading --data-dir")
	fs.StringVar(&token, "admin-token", "", "operator token for --url (default: the admin.token of --data-dir)")
	if err := fs.parse(args, 1, 1); err != nil {
		return err
	}
	id := fs.Arg(0)
	if base != "" {
		of := &operatorFlags{url: base, token: token, dataDir: dataDir}
		fmt.Fprintf(stderr, "asking the directory at %s\n", of.url)
		events, err := findTrace(id, func(nonce string) ([]tracing.Event, error) { return remoteTrace(ctx, of, nonce) })
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return fmt.Errorf("the directory at %s has no events for %q (an intent's nonce, a job id or an envelope id)", of.url, id)
		}
		return printTrace(stdout, events, asJSON)
	}
	fmt.Fprintf(stderr, "reading the log in data directory %s\n", dataDir)
	lg, err := openLogForRead(ctx, dataDir)
	if err != nil {
		return err
	}
	defer lg.Close()
	events, err := findTrace(id, func(nonce string) ([]tracing.Event, error) { return lg.Trace(ctx, nonce) })
	if err != nil {
		return err
	}
	if len(events) == 0 {
		return fmt.Errorf("no events for nonce %q in data directory %s (is that the directory's --data-dir? beam trace --url URL asks a running server)", id, dataDir)
	}
	return printTrace(stdout, events, asJSON)
}

// Log keys of the things beam trace finds besides intents: an Intent
// Protocol job's events are under job:<id>, a pipeline envelope's under
// mesh:<id>.
var tracePrefixes = []string{"job:", "mesh:"}

// findTrace returns the events of id as printed: an intent's nonce, or a
// job's or envelope's id with or without its prefix. read returns the
// events of one log key (none when it has none).
func findTrace(id string, read func(nonce string) ([]tracing.Event, error)) ([]tracing.Event, error) {
	keys := []string{id}
	if !hasTracePrefix(id) {
		for _, p := range tracePrefixes {
			keys = append(keys, p+id)
		}
	}
	for _, k := range keys {
		events, err := read(k)
		if err != nil || len(events) > 0 {
			return events, err
		}
	}
	return nil, nil
}

func hasTracePrefix(id string) bool {
	for _, p := range tracePrefixes {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// remoteTrace reads the events of one log key from a running directory
// (GET /observability/events/{nonce}); none when it has none.
func remoteTrace(ctx context.Context, of *operatorFlags, nonce string) ([]tracing.Event, error) {
	body, status, err := of.call(ctx, http.MethodGet, "/observability/events/"+url.PathEscape(nonce), nil, nil)
	if status == http.StatusNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeEvents(body)
}

// decodeEvents reads the {"events": [...]} answer of a trace route.
func decodeEvents(body []byte) ([]tracing.Event, error) {
	var tr struct {
		Events []tracing.Event `json:"events"`
	}
	if err := json.Unmarshal(body, &tr); err != nil {
		return nil, fmt.Errorf("decode trace: %w", err)
	}
	return tr.Events, nil
}

// printTrace writes events as a readable timeline or as JSON lines.
func printTrace(w io.Writer, events []tracing.Event, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, ev := range events {
			if err := enc.Encode(ev); err != nil {
				return err
			}
		}
		return nil
	}
	first := events[0]
	fmt.Fprintf(w, "nonce %s  %s -> %s  intent %s\n", first.Nonce, first.From, first.To, first.IntentType)
	prev := first.At
	for _, ev := range events {
		details, err := json.Marshal(ev.Details)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%6d  %s  %+8s  %-11s %-12s attempt=%d  %s\n",
			ev.Seq, ev.At.UTC().Format("2006-01-02T15:04:05.000000Z"), ev.At.Sub(prev).Round(time.Microsecond),
			ev.State, ev.Transport, ev.Attempt, details)
		prev = ev.At
	}
	return nil
}

func runImport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var dataDir string
	fs := logCmdFlags("beam import", "beam import [--data-dir DIR] PATH", stderr, &dataDir,
		"Reads a Beam TypeScript directory or message-bus SQLite database (tables intent_log,",
		"intent_trace_events, beam_messages), normalizes legacy statuses and stages, and appends",
		"the intents to the log. Rows that cannot be normalized are reported and not written.")
	if err := fs.parse(args, 1, 1); err != nil {
		return err
	}
	lg, done, err := openLogForWrite(ctx, dataDir)
	if err != nil {
		return err
	}
	defer done()
	rep, err := legacy.Import(ctx, fs.Arg(0), lg, legacy.Options{})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, rep.String())
	if len(rep.Errors) > 0 {
		return fmt.Errorf("%d rows could not be imported", len(rep.Errors))
	}
	return nil
}

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) error {
	rev := buildinfo.Revision()
	if rev == "" {
		rev = "unknown"
	}
	fmt.Fprintf(stdout, "beam %s (revision %s, protocol beam/1)\n", buildinfo.Version, rev)
	return nil
}
