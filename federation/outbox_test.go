package federation

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/testclock"
)

type outboxBundle struct {
	t     *testing.T
	clock *testclock.Clock
	log   *tracing.Log
	ob    *Outbox
	n     int
}

func setupOutbox(t *testing.T) *outboxBundle {
	t.Helper()
	clock := testclock.New(time.Now().UTC().Truncate(time.Millisecond))
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Clock: clock.Now, Synchronous: "NORMAL"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = lg.Close() })
	ob, err := OpenOutbox(context.Background(), lg, clock.Now)
	require.NoError(t, err)
	return &outboxBundle{t: t, clock: clock, log: lg, ob: ob}
}

// enqueue writes a received event and its outbox row in one transaction.
func (b *outboxBundle) enqueue() int64 {
	b.t.Helper()
	b.n++
	nonce := "nonce-" + string(rune('a'+b.n))
	ev := tracing.Event{Nonce: nonce, State: tracing.Received, From: "a@alpha.beam.directory", To: "b@beta.beam.directory", IntentType: "task"}
	require.NoError(b.t, b.ob.Enqueue(context.Background(), newRow{EventID: nonce + "/1", Kind: kindIntent, Peer: "beta.beam.directory",
		Nonce: nonce, Owner: tracing.OwnerBus, Payload: []byte(`{}`)}, ev))
	rows, err := b.ob.Rows(context.Background(), "", 1)
	require.NoError(b.t, err)
	return rows[0].ID
}

func (b *outboxBundle) get(id int64) Row {
	b.t.Helper()
	r, ok, err := b.ob.Get(context.Background(), id)
	require.NoError(b.t, err)
	require.True(b.t, ok)
	return r
}

func (b *outboxBundle) claimOne(relay string) claim {
	b.t.Helper()
	cs, err := b.ob.Claim(context.Background(), relay, 1)
	require.NoError(b.t, err)
	require.Len(b.t, cs, 1)
	return cs[0]
}

func TestOutboxTransitionTable(t *testing.T) {
	t.Parallel()
	allowed := map[[2]OutboxState]bool{
		{"", Pending}: true, {Pending, Claimed}: true, {Claimed, Published}: true, {Claimed, Pending}: true,
		{Claimed, Dead}: true, {Published, Pending}: true, {Dead, Pending}: true,
	}
	from := append([]OutboxState{""}, outboxStates...)
	for _, f := range from {
		for _, to := range outboxStates {
			require.Equal(t, allowed[[2]OutboxState{f, to}], canTransitionOutbox(f, to), "%s → %s", f, to)
		}
	}
}

func TestOutboxEnqueueIsAtomicWithItsEvent(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	// An event the log rejects (acked without received) takes the row with it.
	bad := tracing.Event{Nonce: "x", State: tracing.Acked, From: "a@alpha.beam.directory", To: "b@beta.beam.directory", IntentType: "t"}
	err := b.ob.Enqueue(ctx, newRow{EventID: "x/1", Kind: kindIntent, Peer: "beta.beam.directory", Nonce: "x", Payload: []byte(`{}`)}, bad)
	require.Error(t, err)
	counts, err := b.ob.Counts(ctx)
	require.NoError(t, err)
	require.Zero(t, counts[Pending])
	// A row whose insert fails (duplicate event id) takes the event with it.
	id := b.enqueue()
	ev := tracing.Event{Nonce: "y", State: tracing.Received, From: "a@alpha.beam.directory", To: "b@beta.beam.directory", IntentType: "t"}
	err = b.ob.Enqueue(ctx, newRow{EventID: b.get(id).EventID, Kind: kindIntent, Peer: "beta.beam.directory", Nonce: "y", Payload: []byte(`{}`)}, ev)
	require.Error(t, err)
	_, ok, err := b.log.Intent(ctx, "y")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestOutboxClaimPublish(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	id := b.enqueue()
	r := b.get(id)
	require.Equal(t, Pending, r.State)
	c := b.claimOne("relay-1")
	r = b.get(id)
	require.Equal(t, Claimed, r.State)
	require.Equal(t, "relay-1", r.ClaimedBy)
	require.Equal(t, b.clock.Now(), r.ClaimedAt)
	// A claimed row is not claimable again.
	cs, err := b.ob.Claim(ctx, "relay-2", 10)
	require.NoError(t, err)
	require.Empty(t, cs)
	require.NoError(t, b.ob.Publish(ctx, c))
	r = b.get(id)
	require.Equal(t, Published, r.State)
	require.False(t, r.PublishedAt.IsZero())
	require.Empty(t, r.ClaimedBy)
	require.True(t, r.ClaimedAt.IsZero())
	// PUBLISHED is terminal for the relay: no second finalization, no retry, no death.
	var te *outboxTransitionError
	require.ErrorAs(t, b.ob.Publish(ctx, c), &te)
	require.ErrorAs(t, b.ob.Retry(ctx, c, "x", b.clock.Now()), &te)
	require.ErrorAs(t, b.ob.Kill(ctx, c, "x"), &te)
	cs, err = b.ob.Claim(ctx, "relay-1", 10)
	require.NoError(t, err)
	require.Empty(t, cs)
}

func TestOutboxRetryBackoffAndAvailability(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	id := b.enqueue()
	c := b.claimOne("relay-1")
	require.NoError(t, b.ob.Retry(ctx, c, "peer down", b.clock.Now().Add(time.Second)))
	r := b.get(id)
	require.Equal(t, Pending, r.State)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, "peer down", r.LastError)
	require.Empty(t, r.ClaimedBy)
	require.True(t, r.ClaimedAt.IsZero())
	// Not eligible before available_at.
	cs, err := b.ob.Claim(ctx, "relay-1", 10)
	require.NoError(t, err)
	require.Empty(t, cs)
	b.clock.Advance(time.Second)
	c = b.claimOne("relay-1")
	require.Equal(t, 1, c.Attempts)
	// The old claim can no longer finalize anything.
	require.NoError(t, b.ob.Kill(ctx, c, "gave up"))
	r = b.get(id)
	require.Equal(t, Dead, r.State)
	require.Equal(t, 2, r.Attempts)
	require.Equal(t, "gave up", r.LastError)
	require.Empty(t, r.ClaimedBy)
	// DEAD is never claimed automatically.
	cs, err = b.ob.Claim(ctx, "relay-1", 10)
	require.NoError(t, err)
	require.Empty(t, cs)
}

func TestOutboxForbiddenTransitions(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	var te *outboxTransitionError
	// PENDING → PUBLISHED / DEAD / PENDING(retry) without a claim.
	id := b.enqueue()
	fake := claim{Row{ID: id, ClaimedBy: "relay-1", ClaimedAt: b.clock.Now(), token: "x"}}
	require.ErrorAs(t, b.ob.Publish(ctx, fake), &te)
	require.Equal(t, Pending, te.From)
	require.ErrorAs(t, b.ob.Kill(ctx, fake, "x"), &te)
	require.ErrorAs(t, b.ob.Retry(ctx, fake, "x", b.clock.Now()), &te)
	// Replay only from PUBLISHED or DEAD.
	require.ErrorAs(t, b.ob.Replay(ctx, id), &te)
	c := b.claimOne("relay-1")
	require.ErrorAs(t, b.ob.Replay(ctx, id), &te)
	require.Equal(t, Claimed, te.From)
	require.Equal(t, Claimed, b.get(id).State)
	require.NoError(t, b.ob.Publish(ctx, c))
	require.ErrorIs(t, b.ob.Replay(ctx, 9999), errRowNotFound)
}

func TestOutboxReplay(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	for _, final := range []OutboxState{Published, Dead} {
		id := b.enqueue()
		c := b.claimOne("relay-1")
		if final == Published {
			require.NoError(t, b.ob.Publish(ctx, c))
		} else {
			require.NoError(t, b.ob.Kill(ctx, c, "boom"))
		}
		b.clock.Advance(time.Millisecond)
		require.NoError(t, b.ob.Replay(ctx, id))
		r := b.get(id)
		require.Equal(t, Pending, r.State)
		require.Zero(t, r.Attempts)
		require.Empty(t, r.LastError)
		require.Equal(t, b.clock.Now(), r.AvailableAt)
		c = b.claimOne("relay-1")
		require.Equal(t, id, c.ID)
		require.NoError(t, b.ob.Publish(ctx, c))
	}
}

func TestOutboxClaimVerificationBeforePublished(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	id := b.enqueue()
	c1 := b.claimOne("relay-1")
	// The claim expires and is reaped; another relay claims the row.
	b.clock.Advance(time.Minute)
	n, err := b.ob.Reap(ctx, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r := b.get(id)
	require.Equal(t, Pending, r.State)
	require.Equal(t, 1, r.Attempts)
	require.Contains(t, r.LastError, "claim expired")
	c2 := b.claimOne("relay-2")
	// The first relay may not finalize: its claim is gone.
	require.ErrorIs(t, b.ob.Publish(ctx, c1), errClaimLost)
	require.ErrorIs(t, b.ob.Retry(ctx, c1, "x", b.clock.Now()), errClaimLost)
	require.ErrorIs(t, b.ob.Kill(ctx, c1, "x"), errClaimLost)
	// Even the same relay id with an older claim is fenced by claimed_at/token.
	c2stale := c2
	c2stale.token = "stale"
	require.ErrorIs(t, b.ob.Publish(ctx, c2stale), errClaimLost)
	require.NoError(t, b.ob.Publish(ctx, c2))
	require.Equal(t, Published, b.get(id).State)
}

func TestOutboxDuplicateClaimsAndReapOthers(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	for range 20 {
		b.enqueue()
	}
	// Concurrent relays never get the same row.
	var mu sync.Mutex
	seen := map[int64]string{}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			relay := "relay-" + string(rune('0'+i))
			for {
				cs, err := b.ob.Claim(ctx, relay, 3)
				if err != nil || len(cs) == 0 {
					return
				}
				mu.Lock()
				for _, c := range cs {
					_, dup := seen[c.ID]
					require.False(t, dup, "row %d claimed twice", c.ID)
					seen[c.ID] = relay
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, 20)
	// A new process releases every claim of earlier ones at start.
	n, err := b.ob.ReapOthers(ctx, "relay-new")
	require.NoError(t, err)
	require.Equal(t, 20, n)
	counts, err := b.ob.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(20), counts[Pending])
	// Limit is respected.
	cs, err := b.ob.Claim(ctx, "relay-new", 7)
	require.NoError(t, err)
	require.Len(t, cs, 7)
}

// TestOutboxPublishedCountsItsAttempts: a published row's attempts count
// the publish that succeeded, after the failed ones.
func TestOutboxPublishedCountsItsAttempts(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	first := b.enqueue()
	require.NoError(t, b.ob.Publish(ctx, b.claimOne("relay-1")))
	require.Equal(t, Published, b.get(first).State)
	require.Equal(t, 1, b.get(first).Attempts, "published at the first attempt")

	second := b.enqueue()
	require.NoError(t, b.ob.Retry(ctx, b.claimOne("relay-1"), "peer down", b.clock.Now()))
	require.NoError(t, b.ob.Publish(ctx, b.claimOne("relay-1")))
	require.Equal(t, 2, b.get(second).Attempts, "one failed attempt, then the publish")
}
