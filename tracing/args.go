package tracing

// The writer's statement arguments are values the driver takes without
// conversion: int64, float64, string and nil.

// orNull binds "" as NULL, for columns whose SQL turns NULL into the empty
// string (eventRowSQL).
func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// orNil binds a nil p as NULL.
func orNil[T int64 | float64](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// jsonArg binds a nil r as NULL and any other as TEXT.
func jsonArg(r RawJSON) any {
	if r == nil {
		return nil
	}
	return string(r)
}

// eventNV appends the row of one event (eventInsertCols: its seq becomes
// the rowid SQLite assigns).
func eventNV(a []any, ev *Event, details string, first int64) []any {
	return append(a,
		ev.Nonce, string(ev.State), ev.At.UnixMicro(), orNull(ev.From), orNull(ev.To),
		orNull(ev.IntentType), orNull(ev.Transport), int64(ev.Attempt), details, first)
}

// intentNV appends an intent_log row (intentCols).
func intentNV(a []any, r *IntentRow) []any {
	a = append(a,
		r.Nonce, r.From, r.To, r.IntentType, string(r.Owner), string(r.Status), r.RequestedAt,
		r.ClientTimestamp)
	return intentProgressNV(a, r)
}

// intentProgressNV appends the intent_log columns from attempt on, which
// end both intentCols and the arguments of updateIntent.
func intentProgressNV(a []any, r *IntentRow) []any {
	return append(a,
		int64(r.Attempt), r.Transport, r.TimeoutMs, r.ErrorCode, orNil(r.CompletedAt),
		orNil(r.RoundTripLatencyMs), jsonArg(r.ResultJSON), r.UpdatedAt, r.LastSeq, r.FirstSeq)
}

// intentUpdateNV appends the arguments of updateIntent.
func intentUpdateNV(a []any, r *IntentRow) []any {
	a = append(a, r.From, r.To, r.IntentType, string(r.Status))
	return intentProgressNV(a, r)
}

// messageNV appends a beam_messages row (messageCols).
func messageNV(a []any, m *MessageRow) []any {
	return append(a,
		m.ID, m.Nonce, m.Sender, m.Recipient, m.Intent, jsonArg(m.Payload), string(m.Status),
		int64(m.Priority), int64(m.RetryCount), int64(m.MaxRetries), orNil(m.NextRetryAt),
		m.CreatedAt, orNil(m.DeliveredAt), orNil(m.AckedAt), orNil(m.FailedAt), m.Error,
		jsonArg(m.Response), m.TraceID, jsonArg(m.Metadata), m.LeaseOwner,
		orNil(m.LeaseExpiresAt), m.UpdatedAt, m.LastSeq)
}

// messageUpdateNV appends the arguments of updateMessage.
func messageUpdateNV(a []any, m *MessageRow) []any {
	return append(a,
		string(m.Status), int64(m.RetryCount), orNil(m.NextRetryAt), orNil(m.DeliveredAt),
		orNil(m.AckedAt), orNil(m.FailedAt), m.Error, jsonArg(m.Response), m.LeaseOwner,
		orNil(m.LeaseExpiresAt), m.UpdatedAt, m.LastSeq, m.Nonce)
}
