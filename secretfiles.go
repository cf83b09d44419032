package beam

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/beamdir/beam/directory/attest"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
)

// secretFileMode is the mode of every secret file of the data directory.
const secretFileMode = 0o600

// secretFiles are the data directory's files that hold secrets (tokens,
// private keys, the route password) or that only the server's owner has
// any business reading (the lock, the node ID). The log's own files are
// tracing's (tracing/filemode.go).
var secretFiles = []string{"admin.token", "viewer.token", "intent.secret", federation.KeyFile, attest.KeyFile,
	cluster.NodeIDFile, cluster.CertKeyFile, cluster.SecretFile}

// restrictSecretFiles tightens every secret file present in dataDir to
// secretFileMode: files written by an older version, or copied with a
// loose umask, are owner-only after a start.
func restrictSecretFiles(dataDir string) error {
	for _, name := range secretFiles {
		p := filepath.Join(dataDir, name)
		if err := os.Chmod(p, secretFileMode); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("restrict %s to mode %o: %w", p, secretFileMode, err)
		}
	}
	return nil
}
