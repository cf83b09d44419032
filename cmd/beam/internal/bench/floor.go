package bench

import (
	"crypto/ed25519"
	"math"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// floorBatches and floorBatch shape the measurement of verifyFloor: the
// median of floorBatches timings of floorBatch verifications each.
const (
	floorBatches = 15
	floorBatch   = 200
)

// verifyFloor measures the median cost of one Ed25519 verification of a
// message the size of a typical signed frame, on this machine and at this
// moment, in CPU time of the measuring thread: on a machine that the
// server and the load share, wall time would count the waits for a core
// too. It is the floor under any directory that verifies every
// signature: every run states its own, so its server CPU per operation can
// be read as a multiple of it whatever the machine's speed that hour.
func verifyFloor() time.Duration {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i + 1)
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	msg := make([]byte, 320)
	for i := range msg {
		msg[i] = byte('a' + i%26)
	}
	sig := ed25519.Sign(key, msg)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	samples := make([]time.Duration, 0, floorBatches)
	for range floorBatches {
		t0 := threadCPU()
		for range floorBatch {
			if !ed25519.Verify(pub, msg, sig) {
				panic("bench: ed25519 verification of its own signature failed")
			}
		}
		samples = append(samples, (threadCPU()-t0)/floorBatch)
	}
	slices.Sort(samples)
	return samples[len(samples)/2]
}

// floorFields returns ed25519_verify_ms for d and, when the server's CPU
// per operation is known, that cost as a multiple of the floor.
func floorFields(d time.Duration, perOp *float64) (verifyMs *float64, verifies *float64) {
	v := math.Round(float64(d)/float64(time.Millisecond)*10000) / 10000
	verifyMs = &v
	if perOp != nil && v > 0 {
		r := math.Round(*perOp/v*100) / 100
		verifies = &r
	}
	return verifyMs, verifies
}

// threadCPU returns the CPU time the calling OS thread has used, or the
// wall clock where the thread clock cannot be read.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return time.Duration(time.Now().UnixNano())
	}
	return time.Duration(ts.Nano())
}
