package tracing

import (
	"context"
	"fmt"
	"testing"

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
