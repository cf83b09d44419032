//go:build !unix

package wspark

import (
	"errors"
	"syscall"
)

// canWaitReadable is false here: reads go straight to the connection.
const canWaitReadable = false

func readWhenReady(syscall.RawConn, bool) (*[]byte, int, error) {
	return nil, 0, errors.New("raw reads are not supported on this platform")
}

func waitReadable(syscall.RawConn) error { return nil }
