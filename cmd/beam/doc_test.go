package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocListsEveryCommand keeps the package doc in step with the command
// table: every command has a "beam NAME" line in doc.go.
func TestDocListsEveryCommand(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	for _, c := range commands() {
		found := false
		for _, line := range strings.Split(string(doc), "\n") {
			if strings.HasPrefix(line, "//\t") && (strings.Contains(line, "beam "+c.name+" ") ||
				strings.Contains(line, "beam "+c.name+",") || strings.Contains(line, ", "+c.name+" ")) {
				found = true
				break
			}
		}
		require.True(t, found, "doc.go does not list beam %s", c.name)
	}
}
