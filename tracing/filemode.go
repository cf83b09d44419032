package tracing

import (
	"errors"
	"fmt"
	"os"
)

// logFileMode is the mode of the database and its -wal and -shm files: the
// log holds every agent's API key digest and every payload.
const logFileMode = 0o600

// restrictFiles creates the database file at path with logFileMode when it
// is missing (SQLite then gives its -wal and -shm files the same mode,
// whatever the umask), and tightens an existing database, -wal and -shm to
// logFileMode.
func restrictFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, logFileMode)
	if err != nil {
		return fmt.Errorf("create database file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create database file: %w", err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, logFileMode); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("restrict %s to mode %o: %w", p, logFileMode, err)
		}
	}
	return nil
}
