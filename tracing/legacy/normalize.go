package legacy

import (
	"fmt"
	"strings"

	"github.com/beamdir/beam/tracing"
)

// maxLabelBytes bounds the legacy labels quoted in error messages.
const maxLabelBytes = 64

// legacyStatuses maps the status labels of older directory versions to
// canonical states.
var legacyStatuses = map[string]tracing.State{
	"pending": tracing.Received,
	"success": tracing.Acked,
	"error":   tracing.Failed,
	"expired": tracing.DeadLetter,
}

// cleanLabel trims surrounding blanks and lowercases a legacy label.
func cleanLabel(s string) string {
	return strings.ToLower(strings.TrimSpace(s))
}

// quoteLabel quotes a label for an error message, shortened to a bounded size.
func quoteLabel(s string) string {
	if len(s) > maxLabelBytes {
		s = s[:maxLabelBytes] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// normalizeStatus maps a status of the directory tables (intent_log.status,
// intent_trace_events.status) to its canonical state. Canonical states pass
// through; the legacy labels map as pending→received, success→acked,
// error→failed, expired→dead_letter. Labels are compared without case and
// surrounding blanks. Anything else is an error naming the label.
func normalizeStatus(s string) (tracing.State, error) {
	c := cleanLabel(s)
	if st, ok := legacyStatuses[c]; ok {
		return st, nil
	}
	if st := tracing.State(c); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("unknown legacy status %s", quoteLabel(s))
}

// normalizeBusStatus maps a status of the bus table (beam_messages.status)
// to its canonical state. It differs from normalizeStatus only in that a
// legacy bus message that is pending waits for delivery, so pending maps to
// queued (as the bus migration does); expired maps to dead_letter.
func normalizeBusStatus(s string) (tracing.State, error) {
	if cleanLabel(s) == "pending" {
		return tracing.Queued, nil
	}
	return normalizeStatus(s)
}

// normalizeStage maps a legacy trace event (its stage and status labels) to
// a canonical state, following the reference migration:
//
//	sender_lookup                 received
//	validated with status error   failed
//	dispatch                      dispatched
//	delivery                      success → delivered, error → failed, else dispatched
//	federation.resolve            error → failed, else dispatched
//	federation.relay              success → delivered, error → failed, else dispatched
//	completed                     success → acked, else failed
//	dedupe                        dropped (drop is true, st is empty)
//	a canonical state name        itself
//	anything else                 mapped by its status (normalizeStatus)
//
// Labels are compared without case and surrounding blanks. A stage that is
// neither known nor mappable by its status is an error.
func normalizeStage(stage, status string) (st tracing.State, drop bool, err error) {
	sg, ss := cleanLabel(stage), cleanLabel(status)
	switch sg {
	case "sender_lookup":
		return tracing.Received, false, nil
	case "validated":
		if ss == "error" {
			return tracing.Failed, false, nil
		}
		return tracing.Validated, false, nil
	case "dispatch":
		return tracing.Dispatched, false, nil
	case "delivery", "federation.relay":
		switch ss {
		case "success":
			return tracing.Delivered, false, nil
		case "error":
			return tracing.Failed, false, nil
		}
		return tracing.Dispatched, false, nil
	case "federation.resolve":
		if ss == "error" {
			return tracing.Failed, false, nil
		}
		return tracing.Dispatched, false, nil
	case "completed":
		if ss == "success" {
			return tracing.Acked, false, nil
		}
		return tracing.Failed, false, nil
	case "dedupe":
		return "", true, nil
	}
	if s := tracing.State(sg); s.Valid() {
		return s, false, nil
	}
	s, err := normalizeStatus(status)
	if err != nil {
		return "", false, fmt.Errorf("unknown legacy stage %s with status %s", quoteLabel(stage), quoteLabel(status))
	}
	return s, false, nil
}

// legacyLabel returns label when it differs from the canonical state st,
// and "" when it names st already.
func legacyLabel(label string, st tracing.State) string {
	if label == string(st) {
		return ""
	}
	return label
}
