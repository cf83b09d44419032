package tracing

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/beamdir/beam/internal/jsonscan"
	"github.com/beamdir/beam/internal/tricks"
)

// detailsFoldOn is the details-fold speed trick (BEAM_TRICKS_OFF, package
// internal/tricks): Rebuild decodes stored details with foldParser, a
// hand-written scanner; off, every row goes through decodeKnown
// (encoding/json). It cuts BenchmarkRebuild's CPU by about a fifth
// (docs/BENCHMARKS.md). It stays in this package: it fills Details and
// its BusMessage in place, and a package under internal/ cannot import
// tracing (tracing imports it) without a mirror of those types and a copy
// per row, the work the trick saves.
var detailsFoldOn = tricks.On("details-fold")

// errSlowPath makes decodeFold hand the input to decodeKnown.
var errSlowPath = errors.New("details: not in canonical form")

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
	p := foldParser{b: s}
	if !detailsFoldOn || p.details(d) != nil {
		if err := d.decodeKnown([]byte(s)); err != nil {
			return err
		}
		d.Frame, d.Retryable, d.LegacyStage, d.LegacyStatus = nil, false, "", ""
	}
	return nil
}

type foldParser struct {
	b string
	i int
}

func (p *foldParser) ws() { p.i = jsonscan.SkipSpace(p.b, p.i) }

// next skips whitespace and reports whether the next byte is c (consumed).
func (p *foldParser) next(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// object walks a JSON object, calling field for each key (unescaped keys
// only).
func (p *foldParser) object(field func(key string) error) error {
	return p.list('{', '}', func() error {
		key, esc, err := p.stringSpan()
		if err != nil || esc {
			return errSlowPath
		}
		if !p.next(':') {
			return errSlowPath
		}
		p.ws()
		return field(key)
	})
}

// list walks a JSON object or array delimited by open and closing,
// calling elem at the start of each member (after whitespace).
func (p *foldParser) list(open, closing byte, elem func() error) error {
	if !p.next(open) {
		return errSlowPath
	}
	if p.next(closing) {
		return nil
	}
	for {
		p.ws()
		if err := elem(); err != nil {
			return err
		}
		if p.next(',') {
			continue
		}
		if p.next(closing) {
			return nil
		}
		return errSlowPath
	}
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

func (p *foldParser) details(d *Details) error {
	var seen uint32
	err := p.object(func(key string) error {
		var bit uint32
		var err error
		switch key {
		case "owner":
			bit = fkOwner
			var s string
			s, err = p.str()
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
			err = p.skip()
		case "clientTimestamp":
			bit = fkClientTimestamp
			d.ClientTimestamp, err = p.str()
		case "timeoutMs":
			bit = fkTimeoutMs
			d.TimeoutMs, err = p.int(64)
		case "errorCode":
			bit = fkErrorCode
			d.ErrorCode, err = p.str()
		case "error":
			bit = fkError
			d.Error, err = p.str()
		case "retryable":
			bit = fkRetryable
			err = p.boolean()
		case "latencyMs":
			bit = fkLatencyMs
			var v int64
			v, err = p.int(64)
			d.LatencyMs = &v
		case "result":
			bit = fkResult
			d.Result, err = p.raw()
		case "bus":
			bit = fkBus
			d.Bus = &BusMessage{}
			err = p.bus(d.Bus)
		case "job":
			bit = fkJob
			var raw []byte
			if raw, err = p.raw(); err == nil {
				d.Job = &JobDetails{}
				if json.Unmarshal(raw, d.Job) != nil {
					err = errSlowPath
				}
			}
		case "nextRetryAt":
			bit = fkNextRetryAt
			d.NextRetryAt, err = p.int(64)
		case "retryCount":
			bit = fkRetryCount
			var v int64
			v, err = p.int(strconv.IntSize)
			n := int(v)
			d.RetryCount = &n
		case "leaseOwner":
			bit = fkLeaseOwner
			d.LeaseOwner, err = p.str()
		case "leaseExpiresAt":
			bit = fkLeaseExpiresAt
			d.LeaseExpiresAt, err = p.int(64)
		case "response":
			bit = fkResponse
			d.Response, err = p.raw()
		case "legacyStage":
			bit = fkLegacyStage
			_, err = p.str()
		case "legacyStatus":
			bit = fkLegacyStatus
			_, err = p.str()
		case "mesh":
			bit = fkMesh
			d.Mesh, err = p.raw()
		default:
			if isDetailsKey(key) {
				return errSlowPath // a known key in another case
			}
			return p.skip()
		}
		if err != nil || seen&bit != 0 {
			return errSlowPath
		}
		seen |= bit
		return nil
	})
	if err != nil {
		return err
	}
	p.ws()
	if p.i != len(p.b) {
		return errSlowPath
	}
	return nil
}

func (p *foldParser) bus(m *BusMessage) error {
	var seen uint32
	return p.object(func(key string) error {
		var bit uint32
		var err error
		switch key {
		case "messageId":
			bit = 1
			m.MessageID, err = p.str()
		case "payload":
			bit = 2
			m.Payload, err = p.raw()
		case "priority":
			bit = 4
			var v int64
			v, err = p.int(strconv.IntSize)
			m.Priority = int(v)
		case "maxRetries":
			bit = 8
			var v int64
			v, err = p.int(strconv.IntSize)
			m.MaxRetries = int(v)
		case "traceId":
			bit = 16
			m.TraceID, err = p.str()
		case "metadata":
			bit = 32
			m.Metadata, err = p.raw()
		default:
			for _, k := range [...]string{"messageId", "payload", "priority", "maxRetries", "traceId", "metadata"} {
				if strings.EqualFold(key, k) {
					return errSlowPath
				}
			}
			return p.skip()
		}
		if err != nil || seen&bit != 0 {
			return errSlowPath
		}
		seen |= bit
		return nil
	})
}

// stringSpan consumes a JSON string and returns its contents (still
// escaped) and whether it has escapes.
func (p *foldParser) stringSpan() (string, bool, error) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false, errSlowPath
	}
	end, esc, _, ok := jsonscan.ScanString(p.b, p.i)
	if !ok {
		return "", false, errSlowPath
	}
	span := p.b[p.i+1 : end-1]
	p.i = end
	return span, esc, nil
}

// str decodes a string value: valid UTF-8 and the one-character escapes;
// \u escapes go to the slow path.
func (p *foldParser) str() (string, error) {
	s, esc, err := p.stringSpan()
	if err != nil || !utf8.ValidString(s) {
		return "", errSlowPath
	}
	if !esc {
		return strings.Clone(s), nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		c, ok := jsonscan.Unescape(s[i])
		if !ok {
			return "", errSlowPath
		}
		out = append(out, c)
	}
	return string(out), nil
}

// int decodes a plain JSON integer that fits bits.
func (p *foldParser) int(bits int) (int64, error) {
	start := p.i
	if err := p.number(); err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(p.b[start:p.i], 10, bits)
	if err != nil {
		return 0, errSlowPath // fractions, exponents, overflow: encoding/json decides
	}
	return v, nil
}

func (p *foldParser) boolean() error {
	switch {
	case strings.HasPrefix(p.b[p.i:], "true"):
		p.i += 4
	case strings.HasPrefix(p.b[p.i:], "false"):
		p.i += 5
	default:
		return errSlowPath
	}
	return nil
}

// raw returns a copy of a JSON value other than null.
func (p *foldParser) raw() ([]byte, error) {
	start := p.i
	if strings.HasPrefix(p.b[p.i:], "null") {
		return nil, errSlowPath
	}
	if err := p.skip(); err != nil {
		return nil, err
	}
	return []byte(p.b[start:p.i]), nil
}

// skip consumes and validates one JSON value.
func (p *foldParser) skip() error {
	return p.value(0)
}

// maxFoldDepth bounds nesting on the fast path (encoding/json allows more;
// deeper input takes the slow path).
const maxFoldDepth = 256

func (p *foldParser) value(depth int) error {
	if depth > maxFoldDepth || p.i >= len(p.b) {
		return errSlowPath
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, _, err := p.stringSpan()
		return err
	case c == '{':
		return p.list('{', '}', func() error {
			if _, _, err := p.stringSpan(); err != nil {
				return err
			}
			if !p.next(':') {
				return errSlowPath
			}
			p.ws()
			return p.value(depth + 1)
		})
	case c == '[':
		return p.list('[', ']', func() error { return p.value(depth + 1) })
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	default:
		return p.number()
	}
}

func (p *foldParser) literal(s string) error {
	if !strings.HasPrefix(p.b[p.i:], s) {
		return errSlowPath
	}
	p.i += len(s)
	return nil
}

// number consumes a JSON number (RFC 8259 grammar).
func (p *foldParser) number() error {
	b, i := p.b, p.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return errSlowPath
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return errSlowPath
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return errSlowPath
		}
	}
	p.i = i
	return nil
}
