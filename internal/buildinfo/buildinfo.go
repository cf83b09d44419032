package buildinfo

import "runtime/debug"

// Version is the release version; release builds set it with
// -ldflags "-X github.com/beamdir/beam/internal/buildinfo.Version=v1.2.3".
var Version = "0.1.0-dev"

// Revision returns the VCS revision the binary was built from, or "" when the
// build carries none.
func Revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}
