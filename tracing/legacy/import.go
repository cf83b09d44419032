package legacy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/beamdir/beam/tracing"
)

// appender is what Import needs of the destination log. *tracing.Log
// implements it.
type appender interface {
	// Append writes the events of one nonce atomically, or nothing of them.
	Append(ctx context.Context, events ...tracing.Event) ([]tracing.Event, error)
	// State reports a nonce's current state and whether it exists.
	State(ctx context.Context, nonce string) (tracing.State, bool, error)
}

// Default bounds of Options.
const (
	defaultMaxEventsPerIntent = 1000
	defaultMaxJSONBytes       = 1 << 20
	defaultMaxErrors          = 1000
	defaultWorkers            = 4
)

// Options tune Import. The zero value is ready to use.
type Options struct {
	// Logger receives a warning per rejected row and a summary. Nil logs
	// nothing.
	Logger *slog.Logger
	// DryRun reads, normalizes and checks everything but appends nothing.
	// The report counts what would have been written.
	DryRun bool
	// MaxEventsPerIntent bounds the trace events of one nonce; a nonce with
	// more is rejected. Zero means defaultMaxEventsPerIntent.
	MaxEventsPerIntent int
	// MaxJSONBytes bounds each JSON column (details, result_json, payload,
	// response, metadata). Zero means defaultMaxJSONBytes.
	MaxJSONBytes int
	// Workers is how many appends run at once (each nonce is still one
	// atomic Append; concurrent appends let the log commit them together).
	// Zero means defaultWorkers.
	Workers int
	// MaxErrors bounds Report.Errors; further errors are only counted in
	// Report.ErrorsOmitted. Zero means defaultMaxErrors.
	MaxErrors int
}

// RowError says why one legacy intent or bus message was not imported.
// Nothing of its nonce was written.
type RowError struct {
	// Table is the legacy table of the offending row: tableIntentLog,
	// TableTraceEvents or TableMessages.
	Table string
	// RowID is the id of that row (empty for a trace without intent_log row
	// when no single trace row is at fault).
	RowID string
	// Nonce is the nonce that was not imported.
	Nonce string
	// Err is the reason.
	Err error
}

// Error names the table, row and nonce and gives the reason.
func (e RowError) Error() string {
	var b strings.Builder
	b.WriteString(e.Table)
	if e.RowID != "" {
		b.WriteString(" row ")
		b.WriteString(e.RowID)
	}
	if e.Nonce != "" {
		fmt.Fprintf(&b, " (nonce %s)", quoteLabel(e.Nonce))
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("rejected")
	}
	return b.String()
}

// Unwrap returns the reason.
func (e RowError) Unwrap() error { return e.Err }

// Report counts what Import did.
type Report struct {
	// Intents is the number of directory intents written (from intent_log
	// and from trace events that have no intent_log row).
	Intents int
	// Messages is the number of bus messages written.
	Messages int
	// Events is the number of events written in total.
	Events int
	// Skipped is the number of nonces that already existed in the
	// destination and were left alone.
	Skipped int
	// Errors lists the intents and messages that were rejected, up to
	// Options.MaxErrors: conversion failures in source order, append
	// failures as they happen.
	Errors []RowError
	// ErrorsOmitted counts rejected rows beyond Options.MaxErrors.
	ErrorsOmitted int
	// DryRun is set when nothing was actually written.
	DryRun bool
}

// Rejected is the total number of rejected intents and messages.
func (r Report) Rejected() int { return len(r.Errors) + r.ErrorsOmitted }

// String renders the report for a terminal: one summary line, then one
// line per rejected row.
func (r Report) String() string {
	var b strings.Builder
	verb := "imported"
	if r.DryRun {
		verb = "would import"
	}
	fmt.Fprintf(&b, "%s %d intents and %d bus messages (%d events); skipped %d existing; %d rejected",
		verb, r.Intents, r.Messages, r.Events, r.Skipped, r.Rejected())
	for _, e := range r.Errors {
		b.WriteString("\n  ")
		b.WriteString(e.Error())
	}
	if r.ErrorsOmitted > 0 {
		fmt.Fprintf(&b, "\n  ... and %d more", r.ErrorsOmitted)
	}
	return b.String()
}

// Import reads the legacy Beam database at path (opened read-only) and
// appends its intents and bus messages to dst, one Append per nonce. Nonces
// that dst already has are skipped, so importing twice is harmless. Rows
// that cannot be normalized into a legal sequence are reported in
// Report.Errors and not written.
//
// The error is non-nil when the database is absent, unreadable, malformed or
// has no legacy tables, when dst cannot be queried, or when ctx ends; the
// report then counts what was done so far.
func Import(ctx context.Context, path string, dst appender, opts Options) (Report, error) {
	im := &importer{
		dst:  dst,
		opts: opts,
		log:  opts.Logger,
		conv: converter{lim: limits{
			maxEvents: positiveOr(opts.MaxEventsPerIntent, defaultMaxEventsPerIntent),
			maxBytes:  positiveOr(opts.MaxJSONBytes, defaultMaxJSONBytes),
		}},
		maxErrors: positiveOr(opts.MaxErrors, defaultMaxErrors),
	}
	if im.log == nil {
		im.log = slog.New(slog.DiscardHandler)
	}
	im.rep.DryRun = opts.DryRun
	src, err := openSource(ctx, path)
	if err != nil {
		return im.rep, err
	}
	defer src.close()
	im.src = src
	if err := im.run(ctx); err != nil {
		return im.rep, fmt.Errorf("import %s: %w", path, err)
	}
	im.log.Info("legacy import finished", "path", path, "intents", im.rep.Intents, "messages", im.rep.Messages,
		"events", im.rep.Events, "skipped", im.rep.Skipped, "rejected", im.rep.Rejected(), "dryRun", opts.DryRun)
	return im.rep, nil
}

func positiveOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// importer holds the state of one Import. The reading goroutine reads,
// converts and checks the legacy rows in order and hands each nonce's events
// to a few appending workers, so that the log's group commit can batch
// them; each nonce is still one atomic Append.
type importer struct {
	src       *source
	dst       appender
	opts      Options
	log       *slog.Logger
	conv      converter
	maxErrors int
	jobs      chan job
	cancel    context.CancelCauseFunc

	mu  sync.Mutex // guards rep
	rep Report
}

// job is one nonce's events, ready to append.
type job struct {
	table, rowID, nonce string
	message             bool
	events              []tracing.Event
}

func (im *importer) run(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	im.cancel = cancel
	workers := positiveOr(im.opts.Workers, defaultWorkers)
	im.jobs = make(chan job, 2*workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range im.jobs {
				if err := im.write(ctx, j); err != nil {
					cancel(err)
				}
			}
		})
	}
	err := im.read(ctx)
	close(im.jobs)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		return cause
	}
	return err
}

// read walks the legacy tables and enqueues their nonces.
func (im *importer) read(ctx context.Context) error {
	if im.src.has(tableIntentLog) {
		for after := int64(-1 << 63); ; {
			page, err := im.src.intentPage(ctx, after)
			if err != nil {
				return err
			}
			for i := range page {
				row := &page[i]
				after = row.ID
				if err := im.intent(ctx, row, row.nonce()); err != nil {
					return err
				}
			}
			if len(page) < pageSize {
				break
			}
		}
	}
	for after := ""; ; {
		page, err := im.src.orphanPage(ctx, after)
		if err != nil {
			return err
		}
		for _, nonce := range page {
			after = nonce
			if err := im.intent(ctx, nil, nonce); err != nil {
				return err
			}
		}
		if len(page) < pageSize {
			break
		}
	}
	if im.src.has(TableMessages) {
		for after := int64(-1 << 63); ; {
			page, err := im.src.busPage(ctx, after)
			if err != nil {
				return err
			}
			for i := range page {
				row := &page[i]
				after = row.RowID
				if err := im.message(ctx, row); err != nil {
					return err
				}
			}
			if len(page) < pageSize {
				break
			}
		}
	}
	return nil
}

// intent converts one directory intent. row is nil for a nonce that only
// has trace events.
func (im *importer) intent(ctx context.Context, row *intentRow, nonce string) error {
	if skip, err := im.exists(ctx, nonce); err != nil || skip {
		return err
	}
	traces, err := im.src.traces(ctx, nonce, im.conv.lim.maxEvents)
	if err != nil {
		return err
	}
	events, rerr := im.conv.buildIntent(row, nonce, traces)
	if rerr != nil {
		im.reject(*rerr)
		return nil
	}
	j := job{table: TableTraceEvents, nonce: nonce, events: events}
	if row != nil {
		j.table, j.rowID = tableIntentLog, strconv.FormatInt(row.ID, 10)
	}
	return im.enqueue(ctx, j)
}

// message converts one bus message.
func (im *importer) message(ctx context.Context, row *busRow) error {
	nonce := row.nonce()
	if skip, err := im.exists(ctx, nonce); err != nil || skip {
		return err
	}
	events, rerr := im.conv.buildMessage(row)
	if rerr != nil {
		im.reject(*rerr)
		return nil
	}
	return im.enqueue(ctx, job{table: TableMessages, rowID: row.ID, nonce: nonce, message: true, events: events})
}

// enqueue checks a nonce's events once more and hands them to a worker.
func (im *importer) enqueue(ctx context.Context, j job) error {
	if err := checkSequence(j.events); err != nil {
		im.reject(RowError{Table: j.table, RowID: j.rowID, Nonce: j.nonce, Err: err})
		return nil
	}
	select {
	case im.jobs <- j:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// exists reports (and counts as skipped) a nonce dst already has.
func (im *importer) exists(ctx context.Context, nonce string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, context.Cause(ctx)
	}
	if checkID("nonce", nonce) != nil {
		return false, nil // buildIntent/buildMessage reports it
	}
	_, ok, err := im.dst.State(ctx, nonce)
	if err != nil {
		return false, fmt.Errorf("look up nonce %s: %w", quoteLabel(nonce), err)
	}
	if ok {
		im.mu.Lock()
		im.rep.Skipped++
		im.mu.Unlock()
	}
	return ok, nil
}

// write appends one nonce's events. A rejected append becomes a RowError;
// only an ended context is returned as an error.
func (im *importer) write(ctx context.Context, j job) error {
	if ctx.Err() != nil {
		return nil // the import is ending; the reader reports why
	}
	if !im.opts.DryRun {
		if _, err := im.dst.Append(ctx, j.events...); err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			var te *tracing.TransitionError
			if errors.As(err, &te) && te.From != "" && te.To == tracing.Received {
				// Written by someone else (or twice in the source) since
				// we looked.
				im.mu.Lock()
				im.rep.Skipped++
				im.mu.Unlock()
				return nil
			}
			im.reject(RowError{Table: j.table, RowID: j.rowID, Nonce: j.nonce, Err: fmt.Errorf("append: %w", err)})
			return nil
		}
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	im.rep.Events += len(j.events)
	if j.message {
		im.rep.Messages++
	} else {
		im.rep.Intents++
	}
	return nil
}

// reject records a RowError.
func (im *importer) reject(e RowError) {
	im.log.Warn("legacy row not imported", "table", e.Table, "row", e.RowID, "nonce", e.Nonce, "err", e.Err)
	im.mu.Lock()
	defer im.mu.Unlock()
	if len(im.rep.Errors) < im.maxErrors {
		im.rep.Errors = append(im.rep.Errors, e)
		return
	}
	im.rep.ErrorsOmitted++
}
