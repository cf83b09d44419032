//go:build !race

package beamtest

const raceEnabled = false
