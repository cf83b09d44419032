package web

import (
	"context"
	"net/url"
	"testing"
	"time"
)

// FuzzIntentFilter feeds arbitrary query strings to the intent list's
// parser and runs every accepted filter against a real log: a query is
// either refused as a client mistake or runs, and its page never holds
// more rows than its limit or than the count of all its matches.
func FuzzIntentFilter(f *testing.F) {
	for _, s := range []string{
		"", "status=error", "status=acked,dead_letter&q=alice", "q=%25_%5C", "beamId=a@b&intentType=x&errorCode=OFFLINE",
		"since=2026-01-02T03:04:05Z&until=1767323045000", "hours=0.5&limit=500&offset=10", "status=in_flight,nope",
		"limit=-1", "hours=NaN", "since=99999999999999999999",
	} {
		f.Add(s)
	}
	b := setup(f)
	seed(b)
	now := time.Now()
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		flt, err := parseIntentFilter(q, now)
		if err != nil {
			if _, ok := err.(*queryError); !ok {
				t.Fatalf("parse %q: unexpected error type %T: %v", raw, err, err)
			}
			return
		}
		if flt.limit < 1 || flt.limit > maxListLimit || flt.offset < 0 || flt.offset > maxOffset {
			t.Fatalf("parse %q: limit %d offset %d out of bounds", raw, flt.limit, flt.offset)
		}
		n, err := b.log.CountIntents(context.Background(), flt.q)
		if err != nil {
			t.Fatalf("count for %q: %v", raw, err)
		}
		rows, err := b.log.Intents(context.Background(), flt.q)
		if err != nil {
			t.Fatalf("list for %q: %v", raw, err)
		}
		if len(rows) > flt.limit || int64(len(rows)) > n {
			t.Fatalf("query %q: %d rows on the page, limit %d, %d matches", raw, len(rows), flt.limit, n)
		}
	})
}
