package legacy_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
	"github.com/beamdir/beam/tracing/legacy"
	"github.com/beamdir/beam/tracing/legacy/legacytest"
)

var update = flag.Bool("update", false, "rewrite the SQL dumps under fixtures/legacy")

// fakeLog is an in-memory Appender that enforces tracing.CanTransition and
// writes each Append atomically, like the real log.
type fakeLog struct {
	mu      sync.Mutex
	events  map[string][]tracing.Event
	seq     int64
	appends int
	// reject, when set, fails the append of that nonce with a plain error.
	reject string
}

func newFakeLog() *fakeLog { return &fakeLog{events: map[string][]tracing.Event{}} }

func (f *fakeLog) Append(_ context.Context, events ...tracing.Event) ([]tracing.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := map[string]tracing.State{}
	state := func(n string) tracing.State {
		if s, ok := cur[n]; ok {
			return s
		}
		if evs := f.events[n]; len(evs) > 0 {
			return evs[len(evs)-1].State
		}
		return ""
	}
	for _, e := range events {
		if e.Nonce == f.reject {
			return nil, errors.New("disk on fire")
		}
		if from := state(e.Nonce); !tracing.CanTransition(from, e.State) {
			return nil, &tracing.TransitionError{Nonce: e.Nonce, From: from, To: e.State}
		}
		cur[e.Nonce] = e.State
	}
	out := make([]tracing.Event, len(events))
	for i, e := range events {
		f.seq++
		e.Seq = f.seq
		f.events[e.Nonce] = append(f.events[e.Nonce], e)
		out[i] = e
	}
	f.appends++
	return out, nil
}

func (f *fakeLog) State(_ context.Context, nonce string) (tracing.State, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	evs := f.events[nonce]
	if len(evs) == 0 {
		return "", false, nil
	}
	return evs[len(evs)-1].State, true, nil
}

func (f *fakeLog) trace(nonce string) []tracing.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events[nonce])
}

func (f *fakeLog) count() (nonces, events int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, evs := range f.events {
		nonces++
		events += len(evs)
	}
	return nonces, events
}

func states(evs []tracing.Event) []tracing.State {
	out := make([]tracing.State, len(evs))
	for i, e := range evs {
		out[i] = e.State
	}
	return out
}

type bundle struct {
	dir string
	log *fakeLog
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{dir: t.TempDir(), log: newFakeLog()}
}

func (b *bundle) build(t *testing.T, parts ...legacytest.Part) string {
	t.Helper()
	return legacytest.Build(t, filepath.Join(b.dir, "legacy.db"), parts...)
}

// checkImport verifies a report and the fake log against the fixture
// expectations of parts.
func checkImport(t *testing.T, rep legacy.Report, lg *fakeLog, parts ...legacytest.Part) {
	t.Helper()
	want, broken := legacytest.Expected(parts...)
	wantEvents, wantIntents, wantMessages := 0, 0, 0
	for nonce, w := range want {
		evs := lg.trace(nonce)
		require.Equal(t, w.States, states(evs), "nonce %s", nonce)
		first, last := evs[0], evs[len(evs)-1]
		require.Equal(t, w.Owner, first.Details.Owner, nonce)
		require.NotEmpty(t, first.From, nonce)
		require.NotEmpty(t, first.To, nonce)
		require.NotEmpty(t, first.IntentType, nonce)
		require.Equal(t, w.LegacyStatus, last.Details.LegacyStatus, "final legacy status of %s", nonce)
		for i := 1; i < len(evs); i++ {
			require.False(t, evs[i].At.Before(evs[i-1].At), "%s: event %d goes back in time", nonce, i)
		}
		wantEvents += len(evs)
		if w.Table == legacy.TableMessages {
			wantMessages++
		} else {
			wantIntents++
		}
	}
	require.Equal(t, wantIntents, rep.Intents)
	require.Equal(t, wantMessages, rep.Messages)
	require.Equal(t, wantEvents, rep.Events)
	nonces, events := lg.count()
	require.Equal(t, len(want), nonces, "only the expected nonces are written")
	require.Equal(t, wantEvents, events)

	require.Len(t, rep.Errors, len(broken), "errors: %v", rep.Errors)
	for _, re := range rep.Errors {
		b, ok := broken[re.Nonce]
		require.True(t, ok, "unexpected rejection: %v", re)
		require.Equal(t, b.Table, re.Table, "%v", re)
		require.Equal(t, b.RowID, re.RowID, "%v", re)
		require.Contains(t, re.Error(), b.Reason)
		require.Contains(t, re.Error(), re.Table+" row "+re.RowID)
		require.Contains(t, re.Error(), re.Nonce)
		require.Empty(t, lg.trace(re.Nonce), "rejected nonce %s must not be written", re.Nonce)
	}
}

func TestImportDirectory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Directory)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	checkImport(t, rep, b.log, legacytest.Directory)
	require.Equal(t, rep.Intents, b.log.appends, "one append per nonce")

	// Labels, details, timestamps and the outcome of a fully legacy trace.
	evs := b.log.trace("n-legacy-acked")
	labels := [][2]string{{"sender_lookup", "success"}, {"", "success"}, {"dispatch", "pending"}, {"delivery", "success"}, {"completed", "success"}}
	for i, l := range labels {
		require.Equal(t, l[0], evs[i].Details.LegacyStage, "event %d", i)
		require.Equal(t, l[1], evs[i].Details.LegacyStatus, "event %d", i)
	}
	require.Equal(t, time.Date(2024, 3, 1, 10, 0, 0, 100e6, time.UTC), evs[0].At)
	require.Equal(t, "2024-03-01T10:00:00.000Z", evs[0].Details.ClientTimestamp)
	require.Equal(t, "alice@acme.beam.directory", evs[0].Details.Extra["actingBeamId"])
	require.Equal(t, legacytest.Alice, evs[0].From)
	require.Equal(t, legacytest.Bob, evs[0].To)
	require.Equal(t, legacytest.IntentType, evs[0].IntentType)
	require.Equal(t, "ws", evs[2].Transport)
	require.EqualValues(t, 30000, evs[2].Details.TimeoutMs)
	last := evs[len(evs)-1]
	require.JSONEq(t, `{"v":"1","success":true,"nonce":"n-legacy-acked","payload":{"ok":true}}`, string(last.Details.Result))
	require.NotNil(t, last.Details.LatencyMs)
	require.EqualValues(t, 420, *last.Details.LatencyMs)
	require.EqualValues(t, 105, last.Details.Extra[legacy.ExtraTraceEventID])

	// A failure keeps its code and message.
	evs = b.log.trace("n-legacy-offline")
	require.Equal(t, "OFFLINE", evs[2].Details.ErrorCode)
	require.Equal(t, "recipient offline", evs[2].Details.Error)
	require.Equal(t, "OFFLINE", evs[3].Details.ErrorCode, "intent_log error_code lands on the final event")
	require.Equal(t, "completed", evs[3].Details.LegacyStage)

	// Federation hops keep their details; resolve is a dispatched annotation.
	evs = b.log.trace("n-legacy-federated")
	require.Equal(t, "federation.resolve", evs[2].Details.LegacyStage)
	require.Equal(t, "https://peer.example", evs[2].Details.Extra["peerUrl"])
	require.Equal(t, "federation", evs[3].Transport)

	// Intents without trace are synthesized from intent_log.
	evs = b.log.trace("n-success-no-trace")
	require.Equal(t, time.Date(2024, 3, 1, 10, 9, 0, 0, time.UTC), evs[0].At)
	require.Equal(t, time.Date(2024, 3, 1, 10, 9, 0, 250e6, time.UTC), evs[3].At)
	require.Equal(t, true, evs[1].Details.Extra[legacy.ExtraSynthesized])
	require.JSONEq(t, `{"v":"1","success":true,"nonce":"n-success-no-trace"}`, string(evs[3].Details.Result))
	evs = b.log.trace("n-error-no-trace")
	require.Equal(t, "TIMEOUT", evs[1].Details.ErrorCode)

	// A trace that lacks received gets one; one that stops short of the
	// intent_log status is completed at completed_at.
	evs = b.log.trace("n-no-received-trace")
	require.Equal(t, true, evs[0].Details.Extra[legacy.ExtraSynthesized])
	require.Equal(t, legacy.TransportImport, evs[0].Transport)
	evs = b.log.trace("n-log-ahead")
	require.Equal(t, time.Date(2024, 3, 1, 10, 13, 0, 900e6, time.UTC), evs[3].At)
	require.JSONEq(t, `{"v":"1","success":true,"nonce":"n-log-ahead"}`, string(evs[3].Details.Result))

	// Canonical rows carry no legacy labels.
	for _, e := range b.log.trace("n-canonical") {
		require.Empty(t, e.Details.LegacyStage)
		require.Empty(t, e.Details.LegacyStatus)
	}
	// dedupe rows are gone.
	for _, e := range b.log.trace("n-legacy-dedupe") {
		require.NotEqual(t, "dedupe", e.Details.LegacyStage)
	}
}

func TestImportDirectoryWithoutNonce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.DirectoryWithoutNonce)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	checkImport(t, rep, b.log, legacytest.DirectoryWithoutNonce)
	evs := b.log.trace("legacy-intent-2")
	require.Equal(t, time.Date(2023, 11, 2, 8, 0, 0, 0, time.UTC).Add(time.Minute), evs[0].At)
	require.EqualValues(t, 800, *evs[len(evs)-1].Details.LatencyMs)
}

func TestImportBus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Bus)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	checkImport(t, rep, b.log, legacytest.Bus)

	epoch := func(sec float64) time.Time {
		return time.UnixMicro(int64(sec * 1e6)).UTC()
	}
	evs := b.log.trace("b-acked")
	rcv := evs[0]
	require.Equal(t, legacytest.Alice, rcv.From)
	require.Equal(t, legacytest.Bob, rcv.To)
	require.Equal(t, epoch(1709294405), rcv.At)
	require.NotNil(t, rcv.Details.Bus)
	require.Equal(t, "0b5e7c1a00000000000000000000a006", rcv.Details.Bus.MessageID)
	require.JSONEq(t, `{"n":6}`, string(rcv.Details.Bus.Payload))
	require.Equal(t, 5, rcv.Details.Bus.Priority)
	require.Equal(t, 3, rcv.Details.Bus.MaxRetries)
	require.Equal(t, "trace-6", rcv.Details.Bus.TraceID)
	require.JSONEq(t, `{"source":"fixture"}`, string(rcv.Details.Bus.Metadata))
	require.Equal(t, epoch(1709294405.5), evs[2].At, "delivered at delivered_at")
	require.Equal(t, epoch(1709294406), evs[3].At, "acked at acked_at")
	require.JSONEq(t, `{"ok":true}`, string(evs[3].Details.Response))
	require.Equal(t, 1, *evs[3].Details.RetryCount)

	// pending with a NULL nonce: nonce = id, queued with its retry schedule.
	evs = b.log.trace("0b5e7c1a00000000000000000000a002")
	q := evs[1]
	require.Equal(t, int64(1709294490500), q.Details.NextRetryAt)
	require.Equal(t, 2, *q.Details.RetryCount)
	require.Equal(t, "HTTP 503", q.Details.Error)
	require.Equal(t, "pending", q.Details.LegacyStatus)

	evs = b.log.trace("b-dead-letter")
	require.Equal(t, epoch(1709295000), evs[3].At)
	require.Equal(t, "HTTP 500", evs[3].Details.Error)
	require.Equal(t, 4, *evs[3].Details.RetryCount)
	evs = b.log.trace("b-failed")
	require.Equal(t, "FORBIDDEN", evs[1].Details.Error)
	evs = b.log.trace("b-received")
	require.JSONEq(t, `{"n":1}`, string(evs[0].Details.Bus.Payload))
	require.Equal(t, 5, evs[0].Details.Bus.MaxRetries)
}

func TestImportCombinedAndReimport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Directory, legacytest.Bus)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	checkImport(t, rep, b.log, legacytest.Directory, legacytest.Bus)
	before := b.log.appends

	again, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	require.Zero(t, again.Intents)
	require.Zero(t, again.Messages)
	require.Zero(t, again.Events)
	require.Equal(t, rep.Intents+rep.Messages, again.Skipped)
	require.Len(t, again.Errors, len(rep.Errors), "rejected rows are reported again")
	require.Equal(t, before, b.log.appends, "nothing appended on re-import")
}

func TestImportDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Directory)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{DryRun: true})
	require.NoError(t, err)
	want, broken := legacytest.Expected(legacytest.Directory)
	require.Equal(t, len(want), rep.Intents)
	require.Len(t, rep.Errors, len(broken))
	require.Zero(t, b.log.appends)
	require.True(t, strings.HasPrefix(rep.String(), "would import"))
}

func TestImportAppendFailureIsRowError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.log.reject = "b-acked"
	path := b.build(t, legacytest.Bus)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	var found bool
	for _, re := range rep.Errors {
		if re.Nonce == "b-acked" {
			found = true
			require.ErrorContains(t, re, "disk on fire")
			require.Equal(t, legacy.TableMessages, re.Table)
		}
	}
	require.True(t, found, "append failure reported: %v", rep.Errors)
	require.Empty(t, b.log.trace("b-acked"))
}

func TestImportCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Directory)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := legacy.Import(ctx, path, b.log, legacy.Options{})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, b.log.appends)
}

// cancellingLog cancels the import's context after its first append.
type cancellingLog struct {
	*fakeLog
	cancel context.CancelFunc
}

func (c cancellingLog) Append(ctx context.Context, events ...tracing.Event) ([]tracing.Event, error) {
	out, err := c.fakeLog.Append(ctx, events...)
	c.cancel()
	return out, err
}

func TestImportCancelledMidway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Directory, legacytest.Bus)
	ctx, cancel := context.WithCancel(t.Context())
	rep, err := legacy.Import(ctx, path, cancellingLog{b.log, cancel}, legacy.Options{Workers: 1})
	require.ErrorIs(t, err, context.Canceled)
	want, _ := legacytest.Expected(legacytest.Directory, legacytest.Bus)
	nonces, events := b.log.count()
	require.Less(t, nonces, len(want), "the import stopped early")
	require.Equal(t, events, rep.Events, "the report counts what was written")
	for nonce, w := range want {
		if got := b.log.trace(nonce); len(got) > 0 {
			require.Equal(t, w.States, states(got), "nonce %s written whole", nonce)
		}
	}
}

func TestImportBadDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	garbage := filepath.Join(b.dir, "garbage.db")
	require.NoError(t, os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 100)), 0o600))
	empty := filepath.Join(b.dir, "empty.db")
	legacytest.Exec(t, empty, "CREATE TABLE agents (beam_id TEXT PRIMARY KEY);")
	halfSchema := filepath.Join(b.dir, "half.db")
	legacytest.Exec(t, halfSchema, "CREATE TABLE intent_log (id INTEGER PRIMARY KEY, nonce TEXT);")

	tests := map[string]struct {
		path, want string
	}{
		"absent":         {filepath.Join(b.dir, "nope.db"), "no such file"},
		"directory":      {b.dir, "is a directory"},
		"not sqlite":     {garbage, "open legacy database"},
		"no tables":      {empty, "no legacy Beam tables"},
		"missing column": {halfSchema, "table intent_log has no column from_beam_id"},
	}
	for name, tc := range tests {
		rep, err := legacy.Import(t.Context(), tc.path, b.log, legacy.Options{})
		require.ErrorContains(t, err, tc.want, name)
		require.Zero(t, rep.Events, name)
	}
	require.Zero(t, b.log.appends)

	// The source is opened read-only: importing never changes it.
	path := b.build(t, legacytest.Directory)
	stat, err := os.Stat(path)
	require.NoError(t, err)
	_, err = legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	after, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, stat.ModTime(), after.ModTime())
	require.Equal(t, stat.Size(), after.Size())
}

func TestImportWALSource(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := filepath.Join(b.dir, "wal.db")
	legacytest.Exec(t, path, "PRAGMA journal_mode=WAL;\n"+legacytest.Script(legacytest.Bus))
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
	require.NoError(t, err)
	checkImport(t, rep, b.log, legacytest.Bus)
}

func TestImportBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.build(t, legacytest.Directory)
	rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{MaxEventsPerIntent: 4, MaxErrors: 2})
	require.NoError(t, err)
	require.Len(t, rep.Errors, 2)
	require.Positive(t, rep.ErrorsOmitted)
	require.Contains(t, rep.String(), "more")
	require.Empty(t, b.log.trace("n-legacy-acked"), "five trace events exceed the bound")
	require.NotEmpty(t, b.log.trace("n-legacy-forbidden"))
}

func TestReportString(t *testing.T) {
	t.Parallel()
	rep := legacy.Report{Intents: 3, Messages: 2, Events: 11, Skipped: 1, Errors: []legacy.RowError{
		{Table: legacy.TableTraceEvents, RowID: "17", Nonce: "n-1", Err: errors.New("illegal transition failed -> received")},
	}}
	require.Equal(t, "imported 3 intents and 2 bus messages (11 events); skipped 1 existing; 1 rejected\n"+
		`  intent_trace_events row 17 (nonce "n-1"): illegal transition failed -> received`, rep.String())
}

// TestFixtureDumps keeps the SQL dumps under fixtures/legacy equal to the
// fixture scripts (go test -run TestFixtureDumps -update rewrites them), and
// imports a database built from each dump.
func TestFixtureDumps(t *testing.T) {
	dir := filepath.Join("..", "..", "fixtures", "legacy")
	for _, p := range legacytest.Parts {
		file := filepath.Join(dir, p.Name()+".sql")
		if *update {
			require.NoError(t, os.WriteFile(file, []byte(legacytest.Script(p)), 0o644))
		}
		dump, err := os.ReadFile(file)
		require.NoError(t, err, "run with -update to create it")
		require.Equal(t, legacytest.Script(p), string(dump), "%s is stale; run with -update", file)

		b := setup(t)
		path := filepath.Join(b.dir, "dump.db")
		legacytest.Exec(t, path, string(dump))
		rep, err := legacy.Import(t.Context(), path, b.log, legacy.Options{})
		require.NoError(t, err)
		checkImport(t, rep, b.log, p)
	}
}
