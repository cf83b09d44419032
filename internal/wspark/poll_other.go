//go:build !linux

package wspark

// readPoller is Linux-only; elsewhere every session's reader waits on its
// own goroutine.
type readPoller struct{}

func sharedReadPoller() *readPoller { return nil }

func (p *readPoller) arm(*Conn, int) error { return nil }

func (p *readPoller) forget(uint64) {}
