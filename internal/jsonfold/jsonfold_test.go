package jsonfold

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzSkipAcceptsOnlyJSON: a text Skip consumes whole is valid JSON, and a
// value Raw returns is the JSON value encoding/json sees.
func FuzzSkipAcceptsOnlyJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5e3,-0,"x\"y"],"b":{"c":true,"d":false,"e":null}}`, `[]`, `"s"`, `01`, `{"a":}`, `[1,]`, `1e`, `tru`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := New(s)
		if p.Skip() == nil && p.End() {
			require.True(t, json.Valid([]byte(s)), "Skip accepted %q", s)
		}
		p = New(s)
		if raw, err := p.Raw(); err == nil && p.End() {
			var a, b any
			require.NoError(t, json.Unmarshal([]byte(s), &a))
			require.NoError(t, json.Unmarshal(raw, &b))
			require.Equal(t, a, b)
		}
	})
}

func TestObjectStrInt(t *testing.T) {
	t.Parallel()
	p := New(` {"name":"a\nb","n":42,"big":1.5} `)
	got := map[string]any{}
	err := p.Object(func(key string) error {
		switch key {
		case "name":
			v, err := p.Str()
			got[key] = v
			return err
		case "n":
			v, err := p.Int(64)
			got[key] = v
			return err
		}
		return p.Skip()
	})
	require.NoError(t, err)
	require.True(t, p.End())
	require.Equal(t, map[string]any{"name": "a\nb", "n": int64(42)}, got)

	p = New(`{"n":1.5}`)
	require.ErrorIs(t, p.Object(func(string) error { _, err := p.Int(64); return err }), ErrSlowPath, "fractions go to encoding/json")
}
