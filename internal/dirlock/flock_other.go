//go:build !unix

package dirlock

import (
	"fmt"
	"os"
)

// flock is not available on this platform; data directories cannot be
// guarded, and Acquire refuses rather than pretend.
func flock(*os.File) error {
	return fmt.Errorf("locking a file: %w", ErrUnsupported)
}
