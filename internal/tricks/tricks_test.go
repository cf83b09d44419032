package tricks

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	t.Parallel()
	require.Empty(t, parse(""))
	require.Equal(t, map[string]bool{"a": true, "b": true}, parse(" a, ,b "))
	require.Equal(t, map[string]bool{"all": true}, parse("all"))
}

func TestOnIsTrueWithoutTheVariable(t *testing.T) {
	// The test binary runs without BEAM_TRICKS_OFF unless a developer sets
	// it; then the answer must follow the variable.
	m := parse(getenv())
	require.Equal(t, !m["all"] && !m["some-trick"], On("some-trick"))
}

func getenv() string { v, _ := os.LookupEnv(EnvVar); return v }
