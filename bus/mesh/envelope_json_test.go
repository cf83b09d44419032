package mesh

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// referenceEncode is what Encode must equal: encoding/json with HTML
// escaping off.
func referenceEncode(t testing.TB, e envelope) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(e))
	return string(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// Encode writes every envelope byte for byte as encoding/json does:
// random strings with quotes, backslashes, control characters, HTML
// characters, U+2028/U+2029, invalid UTF-8 and astral runes; nil and empty
// lists and maps; spaced payloads; omitted and present optional fields.
func TestEncodeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\b", "\f", "\r", "\x00", "\x1f", "\x7f", "<", ">", "&",
		"é", "\u2028", "\u2029", "😀", "\xff", "\xe2\x80", "\ufffd", "@acme.beam.directory"}
	str := func() string {
		var b []byte
		for range rng.IntN(6) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		return string(b)
	}
	list := func() []string {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		out := make([]string, 1+rng.IntN(3))
		for i := range out {
			out[i] = str()
		}
		return out
	}
	payloads := []string{`{}`, `{"a":1}`, "{ \"a\" : [1, 2, {\"b\": \"<&>\"}] }\n", `null`, `"s"`, `1.5e3`, `[]`, `{"t":"\u2028 é 😀"}`, ``}
	for i := range 2000 {
		e := envelope{ID: str(), ParentID: str(), Route: meshRoute{Prev: list(), Curr: str(), Next: list()},
			Status: status{Phase: str(), Actor: str(), Attempt: rng.IntN(3) - 1, MaxAttempts: rng.IntN(5), Reason: str(),
				CreatedAt: str(), UpdatedAt: str(), DeadlineAt: str()},
			Payload: json.RawMessage(payloads[rng.IntN(len(payloads))]), Hop: rng.IntN(200), FanoutIndex: rng.IntN(3), Creator: str(), Author: str(), PrevActor: str()}
		if len(e.Payload) == 0 {
			e.Payload = nil
		}
		switch rng.IntN(3) {
		case 0:
		case 1:
			e.Headers = map[string]string{}
		default:
			e.Headers = map[string]string{}
			for range 1 + rng.IntN(4) {
				e.Headers[str()] = str()
			}
		}
		require.Equal(t, referenceEncode(t, e), string(encodeEnvelope(e)), "envelope %d", i)
	}
}

func FuzzEnvelopeEncode(f *testing.F) {
	f.Add("id", "a@b.c", "k", "v", `{"a":1}`)
	f.Add("\u2028", "\xff", "<", "\x00", "[1, 2]")
	f.Fuzz(func(t *testing.T, id, actor, key, value, payload string) {
		if !json.Valid([]byte(payload)) {
			return
		}
		e := envelope{ID: id, Route: meshRoute{Prev: []string{actor}, Curr: actor}, Headers: map[string]string{key: value},
			Status: status{Phase: value, Actor: actor}, Payload: json.RawMessage(payload), Creator: key}
		require.Equal(t, referenceEncode(t, e), string(encodeEnvelope(e)))
	})
}

// benchEnvelope is an envelope as the bench's three-hop route carries it
// at its second hop.
func benchEnvelope() envelope {
	return envelope{ID: "0b7f5f0e-8a43-4c1e-9a55-3f0f1b1e2d3c", Creator: "client@acme.beam.directory",
		Route:   meshRoute{Prev: []string{"one@acme.beam.directory"}, Curr: "two@acme.beam.directory", Next: []string{"three@acme.beam.directory"}},
		Headers: map[string]string{headerFirstAttempt: "2026-11-26T01:50:50.123Z", "trace": "abc"},
		Status: status{Phase: "processing", Actor: "two@acme.beam.directory", Attempt: 1, MaxAttempts: 1,
			CreatedAt: "2026-11-26T01:50:50.120Z", UpdatedAt: "2026-11-26T01:50:50.123Z", DeadlineAt: "2026-11-26T01:55:50.120Z"},
		Payload: json.RawMessage(`{"i":17,"filler":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","one":true}`), Hop: 1}
}

// BenchmarkEnvelopeEncode compares Encode with encoding/json, and a
// stored envelope's decode from the memo (primed by encodeStored) with
// decodeEnvelope.
func BenchmarkEnvelopeEncode(b *testing.B) {
	e := benchEnvelope()
	b.Run("Encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = encodeEnvelope(e)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = referenceEncode(b, e)
		}
	})
	raw := encodeStored(e)
	b.Run("memo-decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = envelopes.decode(raw)
		}
	})
	b.Run("DecodeEnvelope", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = decodeEnvelope(raw)
		}
	})
}
