package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// stream is a Replicator the way the cluster uses one: it holds batches in
// order, fills a gap before a batch with Unshipped, accepts again what it
// holds, can be down, and fences the log once someone else wrote.
type stream struct {
	mu      sync.Mutex
	log     *tracing.Log
	batches [][]byte
	last    int64
	down    bool
	fenced  bool
}

func (s *stream) Replicate(ctx context.Context, batch []byte, last int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.fenced:
		return fmt.Errorf("publish: wrong last sequence: %w", tracing.ErrFenced)
	case s.down:
		return errors.New("no stream leader")
	case last <= s.last:
		return nil // held already
	}
	from, err := tracing.BatchFrom(batch)
	if err != nil {
		return err
	}
	if from != s.last {
		// A gap: ship the log's tail first (it covers this batch too).
		return s.log.Unshipped(ctx, s.last, func(b []byte, l int64) error {
			s.batches = append(s.batches, append([]byte(nil), b...))
			s.last = l
			return nil
		})
	}
	s.batches = append(s.batches, append([]byte(nil), batch...))
	s.last = last
	return nil
}

func (s *stream) set(f func(*stream)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// TestRestartShipsTheTailFirst: durable appends refused while the stream is down
// fail with ErrNotReplicated but stay committed; after a restart the
// stream receives that tail before the new batches, so a taker importing
// the stream has every event, and a fenced log refuses appends.
func TestRestartShipsTheTailFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "beam.db")
	st := &stream{}
	open := func() *tracing.Log {
		l, err := tracing.Open(ctx, tracing.Config{Path: path, Replicator: st})
		require.NoError(t, err)
		st.set(func(s *stream) { s.log = l })
		return l
	}
	recv := func(n string) tracing.Event {
		return tracing.Event{Nonce: n, State: tracing.Received, From: "a@x.beam.directory", To: "b@x.beam.directory", IntentType: "t",
			Details: tracing.Details{Owner: tracing.OwnerBus, Bus: &tracing.BusMessage{MessageID: "m-" + n}}}
	}
	l := open()
	_, err := l.Append(ctx, recv("r-1"))
	require.NoError(t, err)
	st.set(func(s *stream) { s.down = true })
	_, err = l.Append(ctx, recv("r-2"))
	require.ErrorIs(t, err, tracing.ErrNotReplicated)
	require.NoError(t, l.Close())

	st.set(func(s *stream) { s.down = false })
	l = open()
	_, err = l.Append(ctx, recv("r-3"))
	require.NoError(t, err)

	taker, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db")})
	require.NoError(t, err)
	defer taker.Close()
	st.mu.Lock()
	batches := st.batches
	st.mu.Unlock()
	var res tracing.ImportResult
	for i, b := range batches {
		res, err = taker.Import(ctx, tracing.ImportSource{Log: l.ID(), Node: "n1", StreamSeq: uint64(i + 1)}, b)
		require.NoError(t, err)
	}
	require.False(t, res.Duplicate)
	for _, n := range []string{"r-1", "r-2", "r-3"} {
		s, ok, err := taker.State(ctx, n)
		require.NoError(t, err)
		require.True(t, ok, n)
		require.Equal(t, tracing.Received, s)
	}

	st.set(func(s *stream) { s.fenced = true })
	_, err = l.Append(ctx, recv("r-4"))
	require.ErrorIs(t, err, tracing.ErrFenced)
	<-l.Fenced()
	require.NoError(t, l.Close())
}
