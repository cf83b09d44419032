package tracing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestInboxDepths(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := func(nonce, to string, states ...State) {
		first := received(nonce)
		first.To, first.Transport = to, "bus"
		first.Details.Owner = OwnerBus
		first.Details.Bus = &BusMessage{MessageID: "msg-" + nonce, MaxRetries: 3}
		evs := []Event{first}
		for _, s := range states {
			evs = append(evs, Event{Nonce: nonce, State: s, Transport: "bus", Attempt: 1})
		}
		b.append(evs...)
	}
	msg("n1", "bob@acme.beam.directory", Queued)
	msg("n2", "bob@acme.beam.directory", Queued, Dispatched)
	msg("n3", "bob@acme.beam.directory", Queued, Dispatched, DeadLetter)
	msg("n4", "bob@acme.beam.directory", Queued, Dispatched, Delivered, Acked)
	msg("n5", "carol@acme.beam.directory", Queued)
	msg("n6", "dave@acme.beam.directory", Queued, Dispatched, Delivered, Acked)

	got, err := b.log.InboxDepths(context.Background(), []string{"bob@acme.beam.directory", "carol@acme.beam.directory", "dave@acme.beam.directory", "nobody@acme.beam.directory"})
	require.NoError(t, err)
	require.Equal(t, map[string]InboxDepth{
		"bob@acme.beam.directory":   {Queued: 1, Dispatched: 1},
		"carol@acme.beam.directory": {Queued: 1},
	}, got)

	// More recipients than one statement binds.
	many := make([]string, 1200)
	for i := range many {
		many[i] = fmt.Sprintf("r%d@acme.beam.directory", i)
	}
	many[1100] = "carol@acme.beam.directory"
	got, err = b.log.InboxDepths(context.Background(), many)
	require.NoError(t, err)
	require.Equal(t, map[string]InboxDepth{"carol@acme.beam.directory": {Queued: 1}}, got)

	got, err = b.log.InboxDepths(context.Background(), nil)
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestOldestIntentSince(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, ok, err := b.log.OldestIntentSince(context.Background(), time.Time{})
	require.NoError(t, err)
	require.False(t, ok, "an empty log has no oldest intent")
	first := b.append(received("n1"))[0]
	second := b.append(received("n2"))[0]
	got, ok, err := b.log.OldestIntentSince(context.Background(), time.Time{})
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, first.At.Equal(got), "%v != %v", first.At, got)
	got, ok, err = b.log.OldestIntentSince(context.Background(), first.At.Add(time.Microsecond))
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, second.At.Equal(got))
	_, ok, err = b.log.OldestIntentSince(context.Background(), second.At.Add(time.Second))
	require.NoError(t, err)
	require.False(t, ok)
}
