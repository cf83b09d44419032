package attempt

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Loop runs an owner's Tick every Interval, and at once after Kick, in one
// goroutine, until Close or the context of Start ends. Ticks never overlap.
type Loop struct {
	// Interval is the time between ticks; it must be positive.
	Interval time.Duration
	// Tick does the owner's due work: retries due, leases expired,
	// deadlines passed. An error is logged; the loop goes on.
	Tick func(ctx context.Context) error
	// Logger receives tick errors; default slog.Default().
	Logger *slog.Logger
	// Name labels the log lines ("bus", "pipelines", …).
	Name string

	once    sync.Once
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	started bool
	mu      sync.Mutex
}

func (l *Loop) init() {
	l.once.Do(func() {
		l.kick = make(chan struct{}, 1)
		l.stop = make(chan struct{})
		l.done = make(chan struct{})
	})
}

// Start runs the loop in its own goroutine. It does nothing when the loop
// was started or closed before.
func (l *Loop) Start(ctx context.Context) {
	l.init()
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.stop:
		return
	default:
	}
	if l.started {
		return
	}
	l.started = true
	go l.run(ctx)
}

func (l *Loop) run(ctx context.Context) {
	defer close(l.done)
	lg := l.Logger
	if lg == nil {
		lg = slog.Default()
	}
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.stop:
			return
		case <-t.C:
		case <-l.kick:
		}
		if err := l.Tick(ctx); err != nil {
			lg.Warn("tick", "loop", l.Name, "err", err)
		}
	}
}

// Kick asks for a tick now; kicks while a tick runs fold into one.
func (l *Loop) Kick() {
	l.init()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Close stops the loop and waits for a tick in progress to end.
func (l *Loop) Close() {
	l.init()
	l.mu.Lock()
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	started := l.started
	l.mu.Unlock()
	if started {
		<-l.done
	}
}

// Stopping is closed when Close is called; an owner's goroutines use it to
// end their own waits.
func (l *Loop) Stopping() <-chan struct{} {
	l.init()
	return l.stop
}
