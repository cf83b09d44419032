package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// restartTakenOver sets aside the event log another node of the cluster
// took over (err, beam.ErrLogTakenOver), so that beam serve starts again
// with a new, empty log: the registry and everything else the cluster
// shares come back from JetStream as for an empty data directory.
func restartTakenOver(dataDir string, logger *slog.Logger, err error) error {
	aside, serr := setLogAside(dataDir, time.Now())
	if serr != nil {
		return errors.Join(err, serr)
	}
	logger.Warn("another node of the cluster took this node's event log over; it is set aside and the node starts again with a new, empty log",
		"setAside", aside, "reason", err)
	return nil
}

// setLogAside renames the event log of dataDir (beam.db with its -wal and
// -shm files) to beam.db.taken-over-<unix seconds> and returns that path.
func setLogAside(dataDir string, now time.Time) (string, error) {
	path := filepath.Join(dataDir, "beam.db")
	aside := path + ".taken-over-" + strconv.FormatInt(now.Unix(), 10)
	for _, suffix := range []string{"", "-wal", "-shm"} {
		err := os.Rename(path+suffix, aside+suffix)
		if err != nil && !(suffix != "" && errors.Is(err, os.ErrNotExist)) {
			return "", fmt.Errorf("set the taken-over log aside: %w", err)
		}
	}
	return aside, nil
}
