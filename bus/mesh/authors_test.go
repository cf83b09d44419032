package mesh

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHopFrameAuthors: a hop's frame is from the author of its payload and
// its envelope names that author in prev_actor whenever it is not the
// creator's first payload, on every path that sets it.
func TestHopFrameAuthors(t *testing.T) {
	t.Parallel()
	const creator, actor, victim = "alice@acme.beam.directory", "bob@acme.beam.directory", "victim@acme.beam.directory"
	cases := []struct {
		name           string
		prev           []string
		prevActor      string
		from, prevSeen string
	}{
		{"first hop", nil, "", creator, ""},
		{"after an actor", []string{actor}, actor, actor, actor},
		{"rerouted after the first actor failed", []string{victim}, creator, creator, creator},
		{"rerouted after a later actor failed", []string{actor, victim}, actor, actor, actor},
		{"requeued after a rewriting actor", nil, actor, actor, actor},
		{"recorded without prev_actor", []string{actor}, "", actor, actor},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := envelope{ID: "e", Route: meshRoute{Prev: c.prev, Curr: "carol@acme.beam.directory"}, Creator: creator,
				PrevActor: c.prevActor, Payload: json.RawMessage(`{}`)}
			f, _ := hopFrame(env, env.Route.Curr, "n", time.Now())
			require.Equal(t, c.from, f.From)
			got, err := decodeEnvelope(f.Payload)
			require.NoError(t, err)
			require.Equal(t, c.prevSeen, got.PrevActor)
		})
	}
}
