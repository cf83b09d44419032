package dirlock

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ErrUnsupported: this platform has no flock, so nothing can be locked.
var ErrUnsupported = errors.New("file locks need a unix system")

// FileName is the name of the lock file inside a data directory.
const FileName = "beam.lock"

// HeldError reports that another process holds the lock of a data
// directory.
type HeldError struct {
	// Path is the lock file.
	Path string
	// PID is the holder's process id as it wrote it, 0 when unreadable.
	PID int
}

// Error says which process holds the data directory and how to proceed.
func (e *HeldError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "process " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by %s (lock %s); stop it first, or use another --data-dir",
		filepath.Dir(e.Path), who, e.Path)
}

// Lock is a held data-directory lock.
type Lock struct {
	f *os.File
}

// Acquire takes the exclusive lock of dataDir without waiting, creating the
// directory and the lock file when missing, and writes the caller's PID
// into the file. The directory is left with mode 0700 (an existing one is
// tightened): only its owner may list or open what it holds. It returns a
// *HeldError when another process holds it.
func Acquire(dataDir string) (*Lock, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	if err := os.Chmod(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("restrict data directory %s to mode 0700: %w", dataDir, err)
	}
	return AcquireFile(filepath.Join(dataDir, FileName))
}

// AcquireFile takes the exclusive lock of the lock file at path as Acquire
// does, in a directory that exists. It returns a *HeldError when another
// process, or another open of the file in this one, holds it, and an error
// wrapping ErrUnsupported where files cannot be locked.
func AcquireFile(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := flock(f); err != nil {
		pid := readPID(f)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: pid}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// A lock file left by an older version may be readable by others.
	if err := f.Chmod(0o600); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("restrict lock file %s to mode 0600: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write lock file: %w", err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write lock file: %w", err)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up. The file stays, so that a process waiting on
// it never locks an unlinked file. Release on nil is a no-op.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the descriptor drops the flock
	l.f = nil
	return err
}

// readPID reads the holder's PID from the lock file, 0 when it cannot.
func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(string(bytes.TrimSpace(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
