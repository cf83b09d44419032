package wire

import (
	"fmt"
	"time"
)

// ParseTimestamp parses an ISO-8601 timestamp the way JavaScript's Date accepts the forms Beam clients
// send: YYYY-MM-DD, optionally followed by 'T' (or 't' or a space) and HH:mm[:ss[.fraction]], then 'Z'
// or an offset ±HH:mm (±HHmm also accepted). The fraction may have any number of digits and is truncated
// to milliseconds, as Date does; a day beyond the month's end rolls over (2026-02-30 is March 2), and
// 24:00:00 means the next midnight, also as Date does. Date-only strings are UTC. A date-time without a
// zone is rejected: JavaScript would read it in the server's local time zone, which is never meant.
func ParseTimestamp(s string) (time.Time, error) {
	t, err := parseTimestamp(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid timestamp %q: %w", truncateForError(s), err)
	}
	return t, nil
}

func truncateForError(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

type tsScanner struct {
	s   string
	pos int
}

func (sc *tsScanner) digits(n int) (int, bool) {
	if len(sc.s)-sc.pos < n {
		return 0, false
	}
	v := 0
	for i := 0; i < n; i++ {
		c := sc.s[sc.pos+i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	sc.pos += n
	return v, true
}

func (sc *tsScanner) byte(c byte) bool {
	if sc.pos < len(sc.s) && sc.s[sc.pos] == c {
		sc.pos++
		return true
	}
	return false
}

func parseTimestamp(s string) (time.Time, error) {
	if len(s) > 64 {
		return time.Time{}, fmt.Errorf("too long")
	}
	sc := &tsScanner{s: s}
	year, ok := sc.digits(4)
	if !ok {
		return time.Time{}, fmt.Errorf("expected a 4-digit year")
	}
	if !sc.byte('-') {
		return time.Time{}, fmt.Errorf("expected '-' after year")
	}
	month, ok := sc.digits(2)
	if !ok || month < 1 || month > 12 {
		return time.Time{}, fmt.Errorf("invalid month")
	}
	if !sc.byte('-') {
		return time.Time{}, fmt.Errorf("expected '-' after month")
	}
	day, ok := sc.digits(2)
	if !ok || day < 1 || day > 31 {
		return time.Time{}, fmt.Errorf("invalid day")
	}
	if sc.pos == len(s) {
		return time.Date(year, time.Month(month), day, 0, 0, 0, 0, time.UTC), nil
	}
	if !(sc.byte('T') || sc.byte('t') || sc.byte(' ')) {
		return time.Time{}, fmt.Errorf("expected 'T' between date and time")
	}
	hour, ok := sc.digits(2)
	if !ok || hour > 24 {
		return time.Time{}, fmt.Errorf("invalid hour")
	}
	if !sc.byte(':') {
		return time.Time{}, fmt.Errorf("expected ':' after hour")
	}
	minute, ok := sc.digits(2)
	if !ok || minute > 59 {
		return time.Time{}, fmt.Errorf("invalid minute")
	}
	sec, milli := 0, 0
	if sc.byte(':') {
		if sec, ok = sc.digits(2); !ok || sec > 59 {
			return time.Time{}, fmt.Errorf("invalid second")
		}
		if sc.byte('.') {
			n := 0
			for sc.pos < len(s) && s[sc.pos] >= '0' && s[sc.pos] <= '9' {
				if n < 3 {
					milli = milli*10 + int(s[sc.pos]-'0')
				}
				n++
				sc.pos++
			}
			if n == 0 {
				return time.Time{}, fmt.Errorf("expected digits after '.'")
			}
			for ; n < 3; n++ {
				milli *= 10
			}
		}
	}
	if hour == 24 && (minute != 0 || sec != 0 || milli != 0) {
		return time.Time{}, fmt.Errorf("hour 24 is only valid as 24:00:00")
	}
	var offset int
	switch {
	case sc.byte('Z') || sc.byte('z'):
	case sc.pos < len(s) && (s[sc.pos] == '+' || s[sc.pos] == '-'):
		sign := 1
		if s[sc.pos] == '-' {
			sign = -1
		}
		sc.pos++
		oh, ok := sc.digits(2)
		if !ok || oh > 23 {
			return time.Time{}, fmt.Errorf("invalid offset hour")
		}
		sc.byte(':')
		om, ok := sc.digits(2)
		if !ok || om > 59 {
			return time.Time{}, fmt.Errorf("invalid offset minute")
		}
		offset = sign * (oh*3600 + om*60)
	default:
		return time.Time{}, fmt.Errorf("missing time zone ('Z' or ±HH:mm)")
	}
	if sc.pos != len(s) {
		return time.Time{}, fmt.Errorf("unexpected trailing characters")
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, milli*int(time.Millisecond), time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), nil
}
