//go:build race

package beamtest

const raceEnabled = true
