package attempt

import "time"

// Reason says why attempts stopped.
type Reason string

// Reasons of a Verdict that does not retry.
const (
	// Exhausted: the last allowed attempt failed.
	Exhausted Reason = "exhausted"
	// NotRetryable: the failure says another attempt cannot succeed.
	NotRetryable Reason = "not_retryable"
	// OutOfTime: the next attempt would start after the item's deadline
	// or after its MaxDuration since the first attempt.
	OutOfTime Reason = "out_of_time"
)

// Policy is an owner's retry policy: how many attempts an item gets, how
// long it waits between them, and how long it may keep trying.
type Policy struct {
	// Backoff is the wait after each failure.
	Backoff Backoff
	// MaxAttempts counts every attempt, the first included; 0 means no
	// limit.
	MaxAttempts int
	// MaxDuration bounds the time from the first attempt to the start of
	// a retry; 0 means no bound.
	MaxDuration time.Duration
}

// Failure is a failed attempt handed to Decide.
type Failure struct {
	// N is the number of the attempt that failed (1 for the first).
	N int
	// Retryable is false when the failure rules out another attempt.
	Retryable bool
	// First is when the item's first attempt started (zero: unknown).
	First time.Time
	// Now is the time of the decision.
	Now time.Time
	// Deadline, when set, is the time by which a retry must start.
	Deadline time.Time
	// Draw, in [0, 1], picks the backoff's jitter.
	Draw float64
}

// Verdict is what follows a failed attempt: a retry at At, or a stop for
// Reason (the owner dead-letters the item).
type Verdict struct {
	Retry  bool
	Delay  time.Duration
	At     time.Time
	Reason Reason
}

// Decide returns the verdict on f under p.
func (p Policy) Decide(f Failure) Verdict {
	if !f.Retryable {
		return Verdict{Reason: NotRetryable}
	}
	if p.MaxAttempts > 0 && f.N >= p.MaxAttempts {
		return Verdict{Reason: Exhausted}
	}
	d := p.Backoff.Delay(f.N, f.Draw)
	at := f.Now.Add(d)
	if p.MaxDuration > 0 && !f.First.IsZero() && at.Sub(f.First) > p.MaxDuration {
		return Verdict{Reason: OutOfTime}
	}
	if !f.Deadline.IsZero() && !at.Before(f.Deadline) {
		return Verdict{Reason: OutOfTime}
	}
	return Verdict{Retry: true, Delay: d, At: at}
}
