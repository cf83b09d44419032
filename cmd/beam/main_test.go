package main

import (
	"os"
	"testing"

	"github.com/beamdir/beam/internal/beamtest"
)

func TestMain(m *testing.M) { os.Exit(beamtest.Main(m)) }
