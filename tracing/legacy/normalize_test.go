package legacy

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

func TestNormalizeStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want tracing.State
	}{
		{"pending", tracing.Received},
		{"success", tracing.Acked},
		{"error", tracing.Failed},
		{"expired", tracing.DeadLetter},
		{" Success ", tracing.Acked},
		{"PENDING", tracing.Received},
	}
	for _, s := range tracing.States {
		tests = append(tests, struct {
			in   string
			want tracing.State
		}{string(s), s})
	}
	for _, tc := range tests {
		got, err := normalizeStatus(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"", "bogus", "succeeded", "dead-letter", "acked!", strings.Repeat("x", 500)} {
		got, err := normalizeStatus(bad)
		require.Error(t, err, bad)
		require.Empty(t, got)
		require.Contains(t, err.Error(), "unknown legacy status")
		require.Less(t, len(err.Error()), 120, "labels in errors are bounded")
	}
}

func TestNormalizeBusStatus(t *testing.T) {
	t.Parallel()
	tests := map[string]tracing.State{
		"pending":     tracing.Queued,
		"expired":     tracing.DeadLetter,
		"received":    tracing.Received,
		"queued":      tracing.Queued,
		"dispatched":  tracing.Dispatched,
		"delivered":   tracing.Delivered,
		"acked":       tracing.Acked,
		"failed":      tracing.Failed,
		"dead_letter": tracing.DeadLetter,
	}
	for in, want := range tests {
		got, err := normalizeBusStatus(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := normalizeBusStatus("zombie")
	require.ErrorContains(t, err, `unknown legacy status "zombie"`)
}

func TestNormalizeStage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		stage, status string
		want          tracing.State
		drop          bool
	}{
		// sender_lookup → received, whatever the status.
		{"sender_lookup", "success", tracing.Received, false},
		{"sender_lookup", "pending", tracing.Received, false},
		{"sender_lookup", "error", tracing.Received, false},
		// validated with status error → failed; otherwise validated.
		{"validated", "error", tracing.Failed, false},
		{"validated", "success", tracing.Validated, false},
		{"validated", "validated", tracing.Validated, false},
		// dispatch → dispatched.
		{"dispatch", "pending", tracing.Dispatched, false},
		{"dispatch", "success", tracing.Dispatched, false},
		{"dispatch", "error", tracing.Dispatched, false},
		// delivery: success → delivered, error → failed, else dispatched.
		{"delivery", "success", tracing.Delivered, false},
		{"delivery", "error", tracing.Failed, false},
		{"delivery", "pending", tracing.Dispatched, false},
		{"delivery", "", tracing.Dispatched, false},
		// federation.resolve: error → failed, else dispatched.
		{"federation.resolve", "error", tracing.Failed, false},
		{"federation.resolve", "success", tracing.Dispatched, false},
		{"federation.resolve", "pending", tracing.Dispatched, false},
		// federation.relay: success → delivered, error → failed, else dispatched.
		{"federation.relay", "success", tracing.Delivered, false},
		{"federation.relay", "error", tracing.Failed, false},
		{"federation.relay", "pending", tracing.Dispatched, false},
		// completed: success → acked, else failed.
		{"completed", "success", tracing.Acked, false},
		{"completed", "error", tracing.Failed, false},
		{"completed", "pending", tracing.Failed, false},
		// dedupe → row dropped.
		{"dedupe", "success", "", true},
		{"dedupe", "error", "", true},
		// canonical stage names pass through.
		{"received", "received", tracing.Received, false},
		{"queued", "queued", tracing.Queued, false},
		{"dispatched", "dispatched", tracing.Dispatched, false},
		{"delivered", "delivered", tracing.Delivered, false},
		{"acked", "acked", tracing.Acked, false},
		{"failed", "failed", tracing.Failed, false},
		{"dead_letter", "dead_letter", tracing.DeadLetter, false},
		{"delivered", "success", tracing.Delivered, false},
		// anything else is mapped by its status.
		{"relay", "success", tracing.Acked, false},
		{"relay", "pending", tracing.Received, false},
		{"relay", "error", tracing.Failed, false},
		{"ttl", "expired", tracing.DeadLetter, false},
		{"shield", "queued", tracing.Queued, false},
		// labels are compared without case and blanks.
		{" Delivery ", "SUCCESS", tracing.Delivered, false},
	}
	for _, tc := range tests {
		got, drop, err := normalizeStage(tc.stage, tc.status)
		require.NoError(t, err, "%s/%s", tc.stage, tc.status)
		require.Equal(t, tc.want, got, "%s/%s", tc.stage, tc.status)
		require.Equal(t, tc.drop, drop, "%s/%s", tc.stage, tc.status)
	}
	for _, bad := range [][2]string{{"teleport", "maybe"}, {"", ""}, {"relay", "bogus"}} {
		got, drop, err := normalizeStage(bad[0], bad[1])
		require.Error(t, err, "%v", bad)
		require.Contains(t, err.Error(), "unknown legacy stage")
		require.Empty(t, got)
		require.False(t, drop)
	}
}

func TestLegacyLabelsKeptOnTraceEvents(t *testing.T) {
	t.Parallel()
	c := converter{lim: limits{maxEvents: 10, maxBytes: 1 << 10}}
	tests := []struct {
		stage, status            string
		wantStage, wantStatus    string
		wantState                tracing.State
		details                  string
		wantExtra                map[string]any
		wantTransport, wantError string
	}{
		{stage: "delivery", status: "success", wantStage: "delivery", wantStatus: "success", wantState: tracing.Delivered},
		{stage: "delivered", status: "delivered", wantState: tracing.Delivered},
		{stage: "validated", status: "success", wantStatus: "success", wantState: tracing.Validated},
		// Rows that an earlier migration normalized keep their original labels.
		{stage: "delivered", status: "delivered", details: `{"legacyStage":"delivery","legacyStatus":"success","transport":"ws"}`,
			wantStage: "delivery", wantStatus: "success", wantState: tracing.Delivered, wantTransport: "ws"},
		// Reserved keys are never read from legacy details; mistyped known
		// keys are kept under a prefix.
		{stage: "delivery", status: "error", details: `{"owner":"bus","errorCode":7,"error":"boom","peer":"p1"}`,
			wantStage: "delivery", wantStatus: "error", wantState: tracing.Failed, wantError: "boom",
			wantExtra: map[string]any{"legacy.owner": "bus", "legacy.errorCode": "7", "peer": "p1"}},
	}
	for _, tc := range tests {
		r := traceRow{ID: 7, Nonce: "n", Stage: sqlString(tc.stage), Status: sqlString(tc.status),
			Timestamp: "2024-03-01T10:00:00Z", Details: sqlString(tc.details)}
		le, drop, rerr := c.convertTrace(&r)
		require.Nil(t, rerr)
		require.False(t, drop)
		require.Equal(t, tc.wantState, le.ev.State)
		require.Equal(t, tc.wantStage, le.ev.Details.LegacyStage, tc.stage)
		require.Equal(t, tc.wantStatus, le.ev.Details.LegacyStatus, tc.stage)
		require.Equal(t, tc.wantTransport, le.ev.Transport)
		require.Equal(t, tc.wantError, le.ev.Details.Error)
		require.Empty(t, le.ev.Details.Owner)
		require.EqualValues(t, 7, le.ev.Details.Extra[ExtraTraceEventID])
		for k, v := range tc.wantExtra {
			require.Contains(t, le.ev.Details.Extra, k)
			require.Equal(t, v, toString(le.ev.Details.Extra[k]), k)
		}
	}
}

func TestPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		from, to tracing.State
		want     []tracing.State
		ok       bool
	}{
		{tracing.Received, tracing.Received, nil, true},
		{tracing.Received, tracing.Acked, []tracing.State{tracing.Dispatched, tracing.Delivered, tracing.Acked}, true},
		{tracing.Received, tracing.Failed, []tracing.State{tracing.Failed}, true},
		{tracing.Received, tracing.DeadLetter, []tracing.State{tracing.DeadLetter}, true},
		{tracing.Dispatched, tracing.Acked, []tracing.State{tracing.Delivered, tracing.Acked}, true},
		{tracing.Delivered, tracing.Queued, []tracing.State{tracing.Queued}, true},
		{tracing.Acked, tracing.Received, nil, false},
		{tracing.Failed, tracing.Received, nil, false},
	}
	for _, tc := range tests {
		got, ok := path(tc.from, tc.to)
		require.Equal(t, tc.ok, ok, "%s -> %s", tc.from, tc.to)
		require.Equal(t, tc.want, got, "%s -> %s", tc.from, tc.to)
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   any
		unit epochUnit
		want string
	}{
		{"2024-03-01T10:00:00.123Z", epochGuess, "2024-03-01T10:00:00.123Z"},
		{"2024-03-01T11:00:00+01:00", epochGuess, "2024-03-01T10:00:00Z"},
		{"2024-03-01 10:00:00", epochGuess, "2024-03-01T10:00:00Z"},
		{"2024-03-01 10:00:00.5", epochGuess, "2024-03-01T10:00:00.5Z"},
		{int64(1709287200000), epochGuess, "2024-03-01T10:00:00Z"},
		{int64(1709287200), epochGuess, "2024-03-01T10:00:00Z"},
		{1709287200.25, epochSeconds, "2024-03-01T10:00:00.25Z"},
		{"1709287200.5", epochSeconds, "2024-03-01T10:00:00.5Z"},
	}
	for _, tc := range good {
		got, present, err := parseTime(tc.in, tc.unit)
		require.NoError(t, err, "%v", tc.in)
		require.True(t, present)
		require.Equal(t, tc.want, got.Format("2006-01-02T15:04:05.999999999Z07:00"), "%v", tc.in)
	}
	for _, absent := range []any{nil, "", "  "} {
		_, present, err := parseTime(absent, epochGuess)
		require.NoError(t, err)
		require.False(t, present)
	}
	for _, bad := range []any{"yesterday", float64(-1), "1e300", "0001-01-01T00:00:00Z", "9999-01-01T00:00:00Z", []int{1}} {
		_, _, err := parseTime(bad, epochSeconds)
		require.Error(t, err, "%v", bad)
	}
}

func sqlString(s string) sql.NullString {
	return sql.NullString{String: s, Valid: s != ""}
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case interface{ String() string }:
		return x.String()
	}
	return ""
}

func FuzzNormalizeStage(f *testing.F) {
	for _, seed := range [][2]string{
		{"sender_lookup", "success"}, {"validated", "error"}, {"dispatch", "pending"}, {"delivery", "error"},
		{"federation.resolve", "error"}, {"federation.relay", "success"}, {"completed", "success"},
		{"dedupe", "success"}, {"acked", "acked"}, {"unknown", "expired"}, {"", ""}, {"\xff", "ERROR "},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, stage, status string) {
		st, drop, err := normalizeStage(stage, status)
		switch {
		case err != nil:
			require.Empty(t, st)
			require.False(t, drop)
		case drop:
			require.Empty(t, st)
			require.Equal(t, "dedupe", cleanLabel(stage))
		default:
			require.True(t, st.Valid(), "state %q", st)
		}
		for _, norm := range []func(string) (tracing.State, error){normalizeStatus, normalizeBusStatus} {
			s, err := norm(status)
			if err != nil {
				require.Empty(t, s)
				continue
			}
			require.True(t, s.Valid(), "state %q", s)
		}
	})
}

func FuzzConvertTrace(f *testing.F) {
	f.Add("delivery", "success", "2024-03-01T10:00:00Z", `{"transport":"ws","attempt":2,"latencyMs":1.5}`)
	f.Add("completed", "error", "1709287200", `{"errorCode":"OFFLINE"}`)
	f.Add("dedupe", "", "", `[]`)
	f.Add("x", "y", "not a time", `{not json`)
	f.Fuzz(func(t *testing.T, stage, status, ts, details string) {
		c := converter{lim: limits{maxEvents: 10, maxBytes: 1 << 12}}
		r := traceRow{ID: 1, Nonce: "n", Stage: sqlString(stage), Status: sqlString(status),
			Timestamp: ts, Details: sqlString(details)}
		le, drop, rerr := c.convertTrace(&r)
		if rerr != nil || drop {
			return
		}
		require.True(t, le.ev.State.Valid())
		require.False(t, le.ev.At.IsZero())
		require.GreaterOrEqual(t, le.ev.Attempt, 0)
	})
}

// FuzzBuildIntent feeds arbitrary sequences of legacy stages and statuses
// (one byte each, picked from the labels the reference wrote) through the
// converter: whatever it accepts must start with received and obey
// tracing.CanTransition.
func FuzzBuildIntent(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4}, byte(1))
	f.Add([]byte{0, 2, 5, 0, 2}, byte(2))
	f.Add([]byte{6, 7, 8, 9}, byte(0))
	f.Add([]byte{}, byte(3))
	stages := []string{"sender_lookup", "validated", "dispatch", "delivery", "federation.resolve", "federation.relay",
		"completed", "dedupe", "received", "queued", "dispatched", "delivered", "acked", "failed", "dead_letter", "other"}
	statuses := []string{"success", "error", "pending", "expired", "received", "acked", "failed", "queued", "bogus"}
	f.Fuzz(func(t *testing.T, seq []byte, logStatus byte) {
		if len(seq) > 64 {
			seq = seq[:64]
		}
		c := converter{lim: limits{maxEvents: 64, maxBytes: 1 << 10}}
		row := &intentRow{ID: 1, Nonce: sqlString("n"), From: sqlString("a"), To: sqlString("b"),
			IntentType: sqlString("t"), RequestedAt: "2024-03-01T10:00:00Z", CompletedAt: "2024-03-01T11:00:00Z",
			Status: sqlString(statuses[int(logStatus)%len(statuses)])}
		var traces []traceRow
		for i, b := range seq {
			traces = append(traces, traceRow{ID: int64(i + 1), Nonce: "n",
				Stage: sqlString(stages[int(b)%len(stages)]), Status: sqlString(statuses[int(b/16)%len(statuses)]),
				Timestamp: fmt.Sprintf("2024-03-01T10:00:%02dZ", i%60)})
		}
		events, rerr := c.buildIntent(row, "n", traces)
		if rerr != nil {
			require.Nil(t, events)
			require.NotEmpty(t, rerr.Error())
			return
		}
		require.NoError(t, checkSequence(events))
		require.Equal(t, tracing.Received, events[0].State)
		require.Equal(t, tracing.OwnerDirectory, events[0].Details.Owner)
		for i := 1; i < len(events); i++ {
			require.False(t, events[i].At.Before(events[i-1].At))
		}
	})
}
