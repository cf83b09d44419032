//go:build unix

package wspark

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// canWaitReadable is true where the raw socket can be peeked and read.
const canWaitReadable = true

// readWhenReady reads into a pooled chunk once raw's socket has bytes,
// holding the chunk only for the read itself. n == 0 with no error is
// the end of the stream. With now set it does not wait: errWouldBlock
// when the socket has nothing.
func readWhenReady(raw syscall.RawConn, now bool) (*[]byte, int, error) {
	var (
		b    *[]byte
		n    int
		rerr error
	)
	err := raw.Read(func(fd uintptr) bool {
		for {
			b = readChunks.Get().(*[]byte)
			n, rerr = syscall.Read(int(fd), *b)
			if rerr == syscall.EINTR {
				readChunks.Put(b)
				continue
			}
			if rerr == syscall.EAGAIN {
				readChunks.Put(b)
				b = nil
				if now {
					rerr = errWouldBlock
					return true
				}
				return false // the runtime waits for readability and calls again
			}
			return true
		}
	})
	if err == nil && errors.Is(rerr, errWouldBlock) {
		return nil, 0, rerr
	}
	if err == nil && rerr != nil {
		err = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", rerr)}
	}
	if err != nil {
		if b != nil {
			readChunks.Put(b)
		}
		return nil, 0, err
	}
	if n < 0 {
		readChunks.Put(b)
		return nil, 0, errors.New("read returned a negative count")
	}
	return b, n, nil
}

// waitReadable parks until raw's socket is readable, closed or failed, or
// the connection's read deadline passes (the error then wraps
// os.ErrDeadlineExceeded), peeking one byte on the stack instead of reading
// into a buffer.
func waitReadable(raw syscall.RawConn) error {
	return raw.Read(func(fd uintptr) bool {
		var one [1]byte
		for {
			_, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK)
			if err == syscall.EINTR {
				continue
			}
			return err != syscall.EAGAIN
		}
	})
}
