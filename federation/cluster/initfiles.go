package cluster

import "github.com/beamdir/beam/federation"

// InitFiles are the files `beam cluster init` (WriteNodeDirs) writes in
// every node's data directory: the node ID, the shared directory key and
// the route credentials. A node whose data directory lost everything else
// starts again from them as a fresh member of the same cluster.
func InitFiles() []string {
	return append([]string{NodeIDFile, federation.KeyFile}, trustFiles...)
}
