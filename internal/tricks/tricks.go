package tricks

import (
	"os"
	"strings"
	"sync"
)

// EnvVar names the environment variable that turns tricks off.
const EnvVar = "BEAM_TRICKS_OFF"

var off = sync.OnceValue(func() map[string]bool { return parse(os.Getenv(EnvVar)) })

// parse reads a BEAM_TRICKS_OFF value: names separated by commas, spaces
// ignored, "all" for every trick.
func parse(v string) map[string]bool {
	m := map[string]bool{}
	for name := range strings.SplitSeq(v, ",") {
		if name = strings.TrimSpace(name); name != "" {
			m[name] = true
		}
	}
	return m
}

// On reports whether the trick called name is on: true unless
// BEAM_TRICKS_OFF (read once per process) names it or says "all".
func On(name string) bool {
	m := off()
	return !m["all"] && !m[name]
}
