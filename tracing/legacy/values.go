package legacy

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on legacy values.
const (
	// maxNonceBytes bounds nonces and bus message IDs (as the log does).
	maxNonceBytes = 256
	// maxIDBytes bounds Beam IDs, intent types, transports, trace IDs and
	// stage and status labels.
	maxIDBytes = 512
	// maxTextBytes bounds free text such as error messages and labels.
	maxTextBytes = 4096
	// maxIntValue bounds counters (priority, retries, latency, attempts).
	maxIntValue = 1 << 40
)

// timestamps earlier than minTime or later than maxTime are rejected as
// malformed.
var (
	minTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// epochUnit says how a numeric timestamp is to be read.
type epochUnit int

const (
	// epochGuess reads numbers of at least 1e11 as milliseconds and smaller
	// ones as seconds (the directory stores ISO strings; numbers are a guess).
	epochGuess epochUnit = iota
	// epochSeconds reads numbers as (fractional) seconds, as the bus stores them.
	epochSeconds
)

// textLayouts are the textual timestamp layouts accepted, after RFC 3339.
var textLayouts = []string{
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
}

// parseTime reads a dynamically typed SQLite timestamp. present is false for
// NULL or an empty string.
func parseTime(v any, unit epochUnit) (t time.Time, present bool, err error) {
	switch x := v.(type) {
	case nil:
		return time.Time{}, false, nil
	case time.Time:
		t = x
	case int64:
		t, err = fromEpoch(float64(x), unit)
	case float64:
		t, err = fromEpoch(x, unit)
	case []byte:
		return parseTime(string(x), unit)
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			return time.Time{}, false, nil
		}
		if f, ferr := strconv.ParseFloat(s, 64); ferr == nil {
			t, err = fromEpoch(f, unit)
			break
		}
		t, err = parseText(s)
	default:
		return time.Time{}, true, fmt.Errorf("unsupported timestamp type %T", v)
	}
	if err != nil {
		return time.Time{}, true, err
	}
	if t.Before(minTime) || !t.Before(maxTime) {
		return time.Time{}, true, fmt.Errorf("timestamp %s out of range", t.UTC().Format(time.RFC3339))
	}
	return t.UTC(), true, nil
}

// parseText parses an ISO-like timestamp; zone-less ones are UTC.
func parseText(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range textLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("malformed timestamp %s", quoteLabel(s))
}

// fromEpoch converts a numeric epoch value.
func fromEpoch(f float64, unit epochUnit) (time.Time, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e15 {
		return time.Time{}, fmt.Errorf("epoch timestamp %v out of range", f)
	}
	if unit == epochGuess && f >= 1e11 {
		f /= 1000
	}
	sec := math.Floor(f)
	usec := math.Round((f - sec) * 1e6)
	return time.Unix(int64(sec), int64(usec)*int64(time.Microsecond)).UTC(), nil
}

// intValue reads a dynamically typed SQLite integer. present is false for
// NULL. Negative, fractional and oversized values are errors.
func intValue(v any) (n int64, present bool, err error) {
	switch x := v.(type) {
	case nil:
		return 0, false, nil
	case int64:
		n = x
	case float64:
		if math.IsNaN(x) || x != math.Trunc(x) || math.Abs(x) > maxIntValue {
			return 0, true, fmt.Errorf("not an integer: %v", x)
		}
		n = int64(x)
	case []byte:
		return intValue(string(x))
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			return 0, false, nil
		}
		p, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil {
			return 0, true, fmt.Errorf("not an integer: %s", quoteLabel(s))
		}
		n = p
	default:
		return 0, true, fmt.Errorf("unsupported integer type %T", v)
	}
	if n < 0 || n > maxIntValue {
		return 0, true, fmt.Errorf("integer %d out of range", n)
	}
	return n, true, nil
}

// jsonValue validates an optional JSON text column. It returns nil for NULL
// or an empty string, and the compacted JSON otherwise.
func jsonValue(ns sql.NullString, maxBytes int) (json.RawMessage, error) {
	if !ns.Valid || strings.TrimSpace(ns.String) == "" {
		return nil, nil
	}
	if len(ns.String) > maxBytes {
		return nil, fmt.Errorf("JSON of %d bytes exceeds the limit of %d", len(ns.String), maxBytes)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(ns.String)); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	return json.RawMessage(buf.Bytes()), nil
}

// checkID validates an identifier-like value (nonce, Beam ID, intent type).
// Nonces and message ids have a tighter bound than the rest.
func checkID(what, s string) error {
	limit := maxIDBytes
	if what == "nonce" || what == "id" {
		limit = maxNonceBytes
	}
	switch {
	case s == "":
		return fmt.Errorf("%s is empty", what)
	case len(s) > limit:
		return fmt.Errorf("%s of %d bytes exceeds the limit of %d", what, len(s), limit)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	return nil
}

// checkText validates free text.
func checkText(what, s string) error {
	if len(s) > maxTextBytes {
		return fmt.Errorf("%s of %d bytes exceeds the limit of %d", what, len(s), maxTextBytes)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	return nil
}

// errNoDetails is returned by decodeDetails for details that are not a JSON
// object.
var errNoDetails = errors.New("details is not a JSON object")

// decodeDetails parses a legacy details JSON object. NULL or an empty
// string is an empty object.
func decodeDetails(ns sql.NullString, maxBytes int) (map[string]any, error) {
	if !ns.Valid || strings.TrimSpace(ns.String) == "" {
		return nil, nil
	}
	if len(ns.String) > maxBytes {
		return nil, fmt.Errorf("details of %d bytes exceed the limit of %d", len(ns.String), maxBytes)
	}
	if !json.Valid([]byte(ns.String)) {
		return nil, errors.New("malformed details JSON")
	}
	dec := json.NewDecoder(strings.NewReader(ns.String))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("malformed details JSON: %w", err)
	}
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errNoDetails
	}
	return m, nil
}
