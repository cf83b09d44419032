package directory

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A session scheduled on the wheel comes due after a whole interval (the
// ticks of one interval plus the one it was scheduled in), once, and not
// before.
func TestKeepaliveWheelDueAfterOneInterval(t *testing.T) {
	t.Parallel()
	w := newKeepaliveWheel(20 * time.Second)
	require.Equal(t, 20*time.Second/keepaliveSlotsPerInterval, w.tick)
	a, b := &session{beamID: "a"}, &session{beamID: "b"}
	w.schedule(a)
	w.advance() // half a tick later
	w.schedule(b)
	var dueA, dueB int
	for tick := 1; tick <= 3*keepaliveSlotsPerInterval; tick++ {
		for _, s := range w.advance() {
			switch s {
			case a:
				require.Zero(t, dueA, "a came due twice")
				dueA = tick
			case b:
				require.Zero(t, dueB, "b came due twice")
				dueB = tick
			}
		}
	}
	// Each came due k+1 ticks after it was scheduled (k = ticks per
	// interval): scheduled between two ticks, at least one interval passed.
	require.Equal(t, keepaliveSlotsPerInterval+1, 1+dueA, "a was scheduled one advance before the loop")
	require.Equal(t, keepaliveSlotsPerInterval+1, dueB)
}
