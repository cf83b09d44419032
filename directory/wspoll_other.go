//go:build !linux

package directory

// readPoller is Linux-only; elsewhere every session's reader waits on its
// own goroutine.
type readPoller struct{}

func sharedReadPoller() *readPoller { return nil }

func (p *readPoller) arm(*idleConn, int) error { return nil }

func (p *readPoller) forget(uint64) {}
