package tracing

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/beamdir/beam/internal/jsonfold"
)

// decodeFold decodes what the folds read from stored details: every known
// field except frame, retryable, legacyStage and legacyStatus, which are
// checked but left empty. It is Rebuild's fast path: a hand-written scanner
// for the canonical form the log writes (exact key names, each once, plain
// integers and strings, no null); anything else goes through decodeKnown
// (encoding/json), so the result and the errors are those of decodeKnown
// apart from the skipped fields. The input is validated as strictly as
// encoding/json does. Raw values are copied: b may be reused.
func (d *Details) decodeFold(b []byte) error { return d.decodeFoldString(string(b)) }

// decodeFoldString is decodeFold on a string; the decoded strings and raw
// values never share memory with s.
func (d *Details) decodeFoldString(s string) error {
	*d = Details{}
	if len(s) == 0 || s == "{}" {
		return nil
	}
	p := jsonfold.New(s)
	if !jsonfold.On || foldDetails(&p, d) != nil {
		if err := d.decodeKnown([]byte(s)); err != nil {
			return err
		}
		d.Frame, d.Retryable, d.LegacyStage, d.LegacyStatus = nil, false, "", ""
	}
	return nil
}

// Known keys, as bits of a seen-set.
const (
	fkOwner = 1 << iota
	fkFrame
	fkClientTimestamp
	fkTimeoutMs
	fkErrorCode
	fkError
	fkRetryable
	fkLatencyMs
	fkResult
	fkBus
	fkNextRetryAt
	fkRetryCount
	fkLeaseOwner
	fkLeaseExpiresAt
	fkResponse
	fkLegacyStage
	fkLegacyStatus
	fkJob
	fkMesh
)

func foldDetails(p *jsonfold.Parser, d *Details) error {
	var seen uint32
	err := p.Object(func(key string) error {
		var bit uint32
		var err error
		switch key {
		case "owner":
			bit = fkOwner
			var s string
			s, err = p.Str()
			switch Owner(s) {
			case OwnerDirectory:
				d.Owner = OwnerDirectory
			case OwnerBus:
				d.Owner = OwnerBus
			case OwnerJobs:
				d.Owner = OwnerJobs
			default:
				d.Owner = Owner(s)
			}
		case "frame":
			bit = fkFrame
			err = p.Skip()
		case "clientTimestamp":
			bit = fkClientTimestamp
			d.ClientTimestamp, err = p.Str()
		case "timeoutMs":
			bit = fkTimeoutMs
			d.TimeoutMs, err = p.Int(64)
		case "errorCode":
			bit = fkErrorCode
			d.ErrorCode, err = p.Str()
		case "error":
			bit = fkError
			d.Error, err = p.Str()
		case "retryable":
			bit = fkRetryable
			err = p.Bool()
		case "latencyMs":
			bit = fkLatencyMs
			var v int64
			v, err = p.Int(64)
			d.LatencyMs = &v
		case "result":
			bit = fkResult
			d.Result, err = p.Raw()
		case "bus":
			bit = fkBus
			d.Bus = &BusMessage{}
			err = foldBus(p, d.Bus)
		case "job":
			bit = fkJob
			var raw []byte
			if raw, err = p.Raw(); err == nil {
				d.Job = &JobDetails{}
				if json.Unmarshal(raw, d.Job) != nil {
					err = jsonfold.ErrSlowPath
				}
			}
		case "nextRetryAt":
			bit = fkNextRetryAt
			d.NextRetryAt, err = p.Int(64)
		case "retryCount":
			bit = fkRetryCount
			var v int64
			v, err = p.Int(strconv.IntSize)
			n := int(v)
			d.RetryCount = &n
		case "leaseOwner":
			bit = fkLeaseOwner
			d.LeaseOwner, err = p.Str()
		case "leaseExpiresAt":
			bit = fkLeaseExpiresAt
			d.LeaseExpiresAt, err = p.Int(64)
		case "response":
			bit = fkResponse
			d.Response, err = p.Raw()
		case "legacyStage":
			bit = fkLegacyStage
			_, err = p.Str()
		case "legacyStatus":
			bit = fkLegacyStatus
			_, err = p.Str()
		case "mesh":
			bit = fkMesh
			d.Mesh, err = p.Raw()
		default:
			if isDetailsKey(key) {
				return jsonfold.ErrSlowPath // a known key in another case
			}
			return p.Skip()
		}
		if err != nil || seen&bit != 0 {
			return jsonfold.ErrSlowPath
		}
		seen |= bit
		return nil
	})
	if err != nil {
		return err
	}
	if !p.End() {
		return jsonfold.ErrSlowPath
	}
	return nil
}

func foldBus(p *jsonfold.Parser, m *BusMessage) error {
	var seen uint32
	return p.Object(func(key string) error {
		var bit uint32
		var err error
		switch key {
		case "messageId":
			bit = 1
			m.MessageID, err = p.Str()
		case "payload":
			bit = 2
			m.Payload, err = p.Raw()
		case "priority":
			bit = 4
			var v int64
			v, err = p.Int(strconv.IntSize)
			m.Priority = int(v)
		case "maxRetries":
			bit = 8
			var v int64
			v, err = p.Int(strconv.IntSize)
			m.MaxRetries = int(v)
		case "traceId":
			bit = 16
			m.TraceID, err = p.Str()
		case "metadata":
			bit = 32
			m.Metadata, err = p.Raw()
		default:
			for _, k := range [...]string{"messageId", "payload", "priority", "maxRetries", "traceId", "metadata"} {
				if strings.EqualFold(key, k) {
					return jsonfold.ErrSlowPath
				}
			}
			return p.Skip()
		}
		if err != nil || seen&bit != 0 {
			return jsonfold.ErrSlowPath
		}
		seen |= bit
		return nil
	})
}
