package tracing

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// appendMany appends n received events, one call each, for nonces prefix0..
func (b *testBundle) appendMany(prefix string, n int) {
	b.t.Helper()
	for i := range n {
		b.append(received(fmt.Sprintf("%s%d", prefix, i)))
	}
}

// collect reads events from s until it has seen seq upto, and checks that
// they are exactly from+1..upto in order.
func collect(t *testing.T, s *Subscription, from, upto int64) []Event {
	t.Helper()
	var got []Event
	timeout := time.After(30 * time.Second)
	next := from + 1
	for next <= upto {
		select {
		case e, ok := <-s.Events():
			require.True(t, ok, "subscription ended early: %v", s.Err())
			require.Equal(t, next, e.Seq)
			got = append(got, e)
			next++
		case <-timeout:
			t.Fatalf("timed out at seq %d of %d", next, upto)
		}
	}
	return got
}

func TestSubscribeCatchUpThenLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.appendMany("pre", 300)

	sub := b.log.Subscribe(ctx, 0, 100000)
	defer sub.Close()
	const writers, perWriter = 4, 100
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				nonce := fmt.Sprintf("live%d-%d", w, i)
				if _, err := b.log.Append(ctx, received(nonce), ev(nonce, Validated)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	total := int64(300 + writers*perWriter*2)
	got := collect(t, sub, 0, total)
	wg.Wait()
	require.Len(t, got, int(total))
	require.Equal(t, "pre0", got[0].Nonce)
	require.Equal(t, Received, got[0].State)
	require.Equal(t, "alice@acme.beam.directory", got[0].From)
	require.NoError(t, sub.Err())

	// A subscriber from the middle sees exactly the rest.
	sub2 := b.log.Subscribe(ctx, 250, 0)
	collect(t, sub2, 250, total)
	sub2.Close()
	require.NoError(t, sub2.Err())
	_, ok := <-sub2.Events()
	require.False(t, ok)
}

func TestSubscribeLaggedThenResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.appendMany("a", 5)
	sub := b.log.Subscribe(ctx, b.log.LastSeq(), 4)
	// Wait until the subscription is live before the reader stalls.
	require.Eventually(t, func() bool {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		return !sub.catchingUp
	}, 10*time.Second, time.Millisecond)
	b.appendMany("b", 40)
	// The stalled reader now drains what was buffered, then the channel
	// closes with ErrSubscriberLagged.
	last := int64(5)
	for e := range sub.Events() {
		require.Equal(t, last+1, e.Seq)
		last = e.Seq
	}
	require.ErrorIs(t, sub.Err(), ErrSubscriberLagged)
	require.Less(t, last, int64(45))
	require.Greater(t, last, int64(5))

	sub2 := b.log.Subscribe(ctx, last, 64)
	defer sub2.Close()
	collect(t, sub2, last, 45)
	b.append(received("after"))
	collect(t, sub2, 45, 46)
}

// A subscriber whose buffer overflows while it is still catching up from
// the database does not lag: it catches up again.
func TestSubscribeOverflowDuringCatchUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.appendMany("a", 400)
	sub := b.log.Subscribe(ctx, 0, 8)
	defer sub.Close()
	// The reader has not started; the subscription is blocked in catch-up
	// while these commits overflow its buffer.
	b.appendMany("b", 50)
	sub.mu.Lock()
	catching := sub.catchingUp
	sub.mu.Unlock()
	require.True(t, catching)
	collect(t, sub, 0, 450)
	b.append(received("c"))
	collect(t, sub, 450, 451)
	require.NoError(t, sub.Err())
}

func TestSubscribeEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.appendMany("a", 3)
	ctx, cancel := context.WithCancel(context.Background())
	s1 := b.log.Subscribe(ctx, 0, 0)
	collect(t, s1, 0, 3)
	cancel()
	<-s1.Done()
	require.ErrorIs(t, s1.Err(), context.Canceled)

	s2 := b.log.Subscribe(context.Background(), 0, 0)
	collect(t, s2, 0, 3)
	require.NoError(t, b.log.Close())
	<-s2.Done()
	require.ErrorIs(t, s2.Err(), errClosed)

	s3 := b.log.Subscribe(context.Background(), 0, 0)
	<-s3.Done()
	require.ErrorIs(t, s3.Err(), errClosed)
	_, ok := <-s3.Events()
	require.False(t, ok)
	s3.Close()

	b.log.subMu.Lock()
	defer b.log.subMu.Unlock()
	require.Empty(t, b.log.subs)
}
