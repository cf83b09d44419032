//go:build !unix

package dirlock

import (
	"errors"
	"os"
)

// flock is not available on this platform; data directories cannot be
// guarded, and Acquire refuses rather than pretend.
func flock(*os.File) error {
	return errors.New("data-directory locking needs a unix system")
}
