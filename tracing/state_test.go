package tracing

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// transitionMatrix is the expected lifecycle table, written out by hand from
// docs/ARCHITECTURE.md. Columns, in order: received validated queued
// dispatched delivered acked failed dead_letter. "x" = allowed.
var transitionMatrix = map[string]string{
	"(new)":       "x . . . . . . .",
	"received":    "x x x x . . x x",
	"validated":   ". x x x . . x x",
	"queued":      ". . x x . . x x",
	"dispatched":  ". . x x x . x x",
	"delivered":   ". . x . x x x x",
	"acked":       ". . . . . . . .",
	"failed":      ". . x . . . x .",
	"dead_letter": ". . x . . . . x",
}

var matrixColumns = []State{"received", "validated", "queued", "dispatched", "delivered", "acked", "failed", "dead_letter"}

func TestCanTransitionTable(t *testing.T) {
	t.Parallel()
	require.Len(t, transitionMatrix, 9)
	pairs := 0
	for from, line := range transitionMatrix {
		cells := strings.Fields(line)
		require.Len(t, cells, 8, from)
		fromState := State(from)
		if from == "(new)" {
			fromState = ""
		}
		for i, to := range matrixColumns {
			want := cells[i] == "x"
			require.Equal(t, want, CanTransition(fromState, to), "%s -> %s", from, to)
			pairs++
		}
	}
	require.Equal(t, 72, pairs)
}

func TestCanTransitionUnknownStates(t *testing.T) {
	t.Parallel()
	for _, s := range matrixColumns {
		require.False(t, CanTransition(s, "pending"))
		require.False(t, CanTransition("success", s))
	}
	require.False(t, CanTransition("", ""))
	require.False(t, CanTransition("", "Received"))
}

func TestParseState(t *testing.T) {
	t.Parallel()
	for _, s := range matrixColumns {
		got, err := ParseState(string(s))
		require.NoError(t, err)
		require.Equal(t, s, got)
	}
	_, err := ParseState("expired")
	require.ErrorContains(t, err, "expired")
}

func TestBucketsAndTerminal(t *testing.T) {
	t.Parallel()
	cases := []struct {
		s        State
		bucket   Bucket
		terminal bool
	}{
		{"received", "in_flight", false},
		{"validated", "in_flight", false},
		{"queued", "in_flight", false},
		{"dispatched", "in_flight", false},
		{"delivered", "in_flight", false},
		{"acked", "success", true},
		{"failed", "error", true},
		{"dead_letter", "error", true},
	}
	require.Len(t, cases, len(States))
	for _, c := range cases {
		require.Equal(t, c.bucket, c.s.Bucket(), c.s)
		require.Equal(t, c.terminal, c.s.Terminal(), c.s)
		require.True(t, c.s.Valid())
	}
	require.False(t, State("pending").Valid())
}

func TestTransitionErrorMessage(t *testing.T) {
	t.Parallel()
	e := &TransitionError{Nonce: "n1", From: "", To: Acked}
	require.Contains(t, e.Error(), "(new) -> acked")
}

// TestOpenAndTerminalListsPartitionStates: the SQL lists the queries use
// name every state exactly once, the open ones in openList.
func TestOpenAndTerminalListsPartitionStates(t *testing.T) {
	parse := func(list string) []string {
		var out []string
		for _, f := range strings.Split(strings.Trim(list, "()"), ",") {
			out = append(out, strings.Trim(f, "'"))
		}
		return out
	}
	open, terminal := parse(openList), parse(terminalList)
	var wantOpen, wantTerminal []string
	for _, s := range States {
		if s.Terminal() {
			wantTerminal = append(wantTerminal, string(s))
		} else {
			wantOpen = append(wantOpen, string(s))
		}
	}
	require.ElementsMatch(t, wantOpen, open)
	require.ElementsMatch(t, wantTerminal, terminal)
}
