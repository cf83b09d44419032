//go:build unix

package dirlock

import (
	"os"
	"syscall"
)

// flock takes an exclusive, non-blocking flock on f. The lock belongs to
// the open file description, so it is released when f is closed or the
// process dies, however it dies.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
