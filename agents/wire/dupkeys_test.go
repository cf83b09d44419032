package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzCheckNoDuplicateKeys checks the duplicate-key detector against its
// invariants: it agrees with the parser on validity; a reported key really
// occurs twice in one object of the text; JSON.parse's normalised form of
// any text has no duplicates left; and a text it accepts keeps all its
// members through that normalisation (as many keys in as out).
func FuzzCheckNoDuplicateKeys(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":1}`, `{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`, `[{"x":1},{"x":2}]`,
		`{"payload":{"amount":1,"amount":1000}}`, `{"\u0061":1,"a":2}`, `{"a":[{"c":1,"c":1}]}`, `"x"`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := CheckNoDuplicateKeys(data)
		_, perr := parseJSON(data)
		if perr != nil {
			require.Error(t, err, "invalid JSON must not pass")
			var dup *DuplicateKeyError
			require.False(t, errors.As(err, &dup))
			return
		}
		norm, nerr := JSStringify(data)
		if nerr != nil {
			return // not representable the JavaScript way (lone surrogates in keys and the like)
		}
		require.NoError(t, CheckNoDuplicateKeys(norm), "JSON.parse's reading has no duplicates: %s", norm)
		var dup *DuplicateKeyError
		if errors.As(err, &dup) {
			require.Greater(t, countKeys(t, data), countKeys(t, norm), "a reported duplicate is dropped by normalisation")
			return
		}
		require.NoError(t, err)
		require.Equal(t, countKeys(t, data), countKeys(t, norm), "no member lost when there is no duplicate")
	})
}

// countKeys counts every object key in a JSON text with encoding/json's
// tokenizer, which keeps duplicates.
func countKeys(t *testing.T, data []byte) int {
	t.Helper()
	type level struct{ obj, wantKey bool }
	var stack []level
	valueDone := func() {
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return n
		}
		d, isDelim := tok.(json.Delim)
		if top := len(stack) - 1; top >= 0 && stack[top].obj && stack[top].wantKey && !isDelim {
			n++
			stack[top].wantKey = false
			continue
		}
		switch {
		case isDelim && d == '{':
			stack = append(stack, level{obj: true, wantKey: true})
		case isDelim && d == '[':
			stack = append(stack, level{})
		case isDelim:
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}
