package tracing

// Helpers that append statement arguments to a list, as values the driver
// takes without conversion (int64, float64, string, nil).

func nvText(a []any, s string) []any {
	return append(a, s)
}

// nvTextOrNull binds "" as NULL, for columns whose SQL turns NULL into the empty string
// (eventRowSQL).
func nvTextOrNull(a []any, s string) []any {
	if s == "" {
		return append(a, nil)
	}
	return append(a, s)
}

func nvInt(a []any, n int64) []any {
	return append(a, n)
}

func nvIntPtr(a []any, p *int64) []any {
	if p == nil {
		return append(a, nil)
	}
	return append(a, *p)
}

func nvFloat(a []any, f float64) []any {
	return append(a, f)
}

func nvFloatPtr(a []any, p *float64) []any {
	if p == nil {
		return append(a, nil)
	}
	return append(a, *p)
}

func nvJSON(a []any, r RawJSON) []any {
	if r == nil {
		return append(a, nil)
	}
	return append(a, string(r))
}

// eventNV appends the row of one event (eventInsertCols: its seq becomes
// the rowid SQLite assigns).
func eventNV(a []any, ev *Event, details string, first int64) []any {
	a = nvText(a, ev.Nonce)
	a = nvText(a, string(ev.State))
	a = nvInt(a, ev.At.UnixMicro())
	a = nvTextOrNull(a, ev.From)
	a = nvTextOrNull(a, ev.To)
	a = nvTextOrNull(a, ev.IntentType)
	a = nvTextOrNull(a, ev.Transport)
	a = nvInt(a, int64(ev.Attempt))
	a = nvText(a, details)
	return nvInt(a, first)
}

// intentNV appends an intent_log row (intentCols).
func intentNV(a []any, r *IntentRow) []any {
	a = nvText(a, r.Nonce)
	a = nvText(a, r.From)
	a = nvText(a, r.To)
	a = nvText(a, r.IntentType)
	a = nvText(a, string(r.Owner))
	a = nvText(a, string(r.Status))
	a = nvInt(a, r.RequestedAt)
	a = nvText(a, r.ClientTimestamp)
	return intentProgressNV(a, r)
}

// intentProgressNV appends the intent_log columns from attempt on, which
// end both intentCols and the arguments of updateIntent.
func intentProgressNV(a []any, r *IntentRow) []any {
	a = nvInt(a, int64(r.Attempt))
	a = nvText(a, r.Transport)
	a = nvInt(a, r.TimeoutMs)
	a = nvText(a, r.ErrorCode)
	a = nvIntPtr(a, r.CompletedAt)
	a = nvIntPtr(a, r.RoundTripLatencyMs)
	a = nvJSON(a, r.ResultJSON)
	a = nvInt(a, r.UpdatedAt)
	a = nvInt(a, r.LastSeq)
	return nvInt(a, r.FirstSeq)
}

// intentUpdateNV appends the arguments of updateIntent.
func intentUpdateNV(a []any, r *IntentRow) []any {
	a = nvText(a, r.From)
	a = nvText(a, r.To)
	a = nvText(a, r.IntentType)
	a = nvText(a, string(r.Status))
	return intentProgressNV(a, r)
}

// messageNV appends a beam_messages row (messageCols).
func messageNV(a []any, m *MessageRow) []any {
	a = nvText(a, m.ID)
	a = nvText(a, m.Nonce)
	a = nvText(a, m.Sender)
	a = nvText(a, m.Recipient)
	a = nvText(a, m.Intent)
	a = nvJSON(a, m.Payload)
	a = nvText(a, string(m.Status))
	a = nvInt(a, int64(m.Priority))
	a = nvInt(a, int64(m.RetryCount))
	a = nvInt(a, int64(m.MaxRetries))
	a = nvFloatPtr(a, m.NextRetryAt)
	a = nvFloat(a, m.CreatedAt)
	a = nvFloatPtr(a, m.DeliveredAt)
	a = nvFloatPtr(a, m.AckedAt)
	a = nvFloatPtr(a, m.FailedAt)
	a = nvText(a, m.Error)
	a = nvJSON(a, m.Response)
	a = nvText(a, m.TraceID)
	a = nvJSON(a, m.Metadata)
	a = nvText(a, m.LeaseOwner)
	a = nvFloatPtr(a, m.LeaseExpiresAt)
	a = nvFloat(a, m.UpdatedAt)
	return nvInt(a, m.LastSeq)
}

// messageUpdateNV appends the arguments of updateMessage.
func messageUpdateNV(a []any, m *MessageRow) []any {
	a = nvText(a, string(m.Status))
	a = nvInt(a, int64(m.RetryCount))
	a = nvFloatPtr(a, m.NextRetryAt)
	a = nvFloatPtr(a, m.DeliveredAt)
	a = nvFloatPtr(a, m.AckedAt)
	a = nvFloatPtr(a, m.FailedAt)
	a = nvText(a, m.Error)
	a = nvJSON(a, m.Response)
	a = nvText(a, m.LeaseOwner)
	a = nvFloatPtr(a, m.LeaseExpiresAt)
	a = nvFloat(a, m.UpdatedAt)
	a = nvInt(a, m.LastSeq)
	return nvText(a, m.Nonce)
}
