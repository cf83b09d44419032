package wire

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/jsonscan"
)

func TestJSStringifyTable(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"empty object", ` { } `, `{}`},
		{"empty array", `[ ]`, `[]`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"one point zero", `1.0`, `1`},
		{"1e21", `1e21`, `1e+21`},
		{"1e20", `1e20`, `100000000000000000000`},
		{"1e-7", `1e-7`, `1e-7`},
		{"1e-6", `0.000001`, `0.000001`},
		{"small exponent", `123e-20`, `1.23e-18`},
		{"negative zero", `-0`, `0`},
		{"negative zero float", `-0.0e5`, `0`},
		{"tenth", `0.1`, `0.1`},
		{"2^53+1", `9007199254740993`, `9007199254740992`},
		{"big int", `123456789012345678901234`, `1.2345678901234569e+23`},
		{"overflow", `1e400`, `null`},
		{"underflow", `-1e-400`, `0`},
		{"min subnormal", `5e-324`, `5e-324`},
		{"max", `1.7976931348623157e308`, `1.7976931348623157e+308`},
		{"upper E", `1E+2`, `100`},
		{"index keys first", `{"b":1,"10":2,"2":3,"a":4,"0":5}`, `{"0":5,"2":3,"10":2,"b":1,"a":4}`},
		{"not index keys", `{"b":1,"01":2,"-1":3,"1.5":4,"4294967295":5,"4294967294":6}`, `{"4294967294":6,"b":1,"01":2,"-1":3,"1.5":4,"4294967295":5}`},
		{"duplicates", `{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`},
		{"duplicate object replaced", `{"a":{"x":1},"b":0,"a":{"y":2}}`, `{"a":{"y":2},"b":0}`},
		{"escapes", `"\"\\\/\b\f\n\r\t\u0001\u001F\u007f"`, "\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\""},
		{"non-ascii escapes decoded", `"\u00fc\u20AC\ud83d\ude00"`, `"ü€😀"`},
		{"raw non-ascii kept", `"ü€😀"`, `"ü€😀"`},
		{"line separators raw", `"\u2028\u2029"`, "\"\u2028\u2029\""},
		{"lone high", `"\ud800"`, `"\ud800"`},
		{"lone low upper hex", `"\uDC00x"`, `"\udc00x"`},
		{"high then non-low", `"\ud800\u0041"`, `"\ud800A"`},
		{"reversed pair", `"\ude00\ud83d"`, `"\ude00\ud83d"`},
		{"html not escaped", `"<a>&</a>"`, `"<a>&</a>"`},
		{"proto key kept", `{"__proto__":{"x":1}}`, `{"__proto__":{"x":1}}`},
		{"nested", `{"a":[1,{"2":2,"b":[]}]}`, `{"a":[1,{"2":2,"b":[]}]}`},
		{"whitespace", " \t\r\n{ \"a\" : [ 1 , 2 ] } \n", `{"a":[1,2]}`},
	}
	for _, tc := range cases {
		got, err := JSStringify([]byte(tc.in))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, string(got), tc.name)
	}
}

func TestJSStringifyInvalidUTF8LikeNode(t *testing.T) {
	t.Parallel()
	// Node decodes E2 82 41 ED A0 80 F0 90 as U+FFFD A U+FFFD U+FFFD U+FFFD U+FFFD (maximal subparts).
	in := []byte{'"', 0xe2, 0x82, 'A', 0xed, 0xa0, 0x80, 0xf0, 0x90, '"'}
	got, err := JSStringify(in)
	require.NoError(t, err)
	require.Equal(t, "\"\uFFFDA\uFFFD\uFFFD\uFFFD\uFFFD\"", string(got))
}

func TestJSStringifyRejects(t *testing.T) {
	t.Parallel()
	bad := []string{
		``, ` `, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{a:1}`, `'a'`, `01`, `1.`, `.5`,
		`1e`, `1e+`, `-`, `+1`, `NaN`, `Infinity`, `tru`, `nul`, `"abc`, `"\x"`, `"\u12"`, `"\u12G4"`,
		"\"a\tb\"", "\"\x00\"", `{"a":1}{}`, `[] x`, "\ufeff{}", `{"a":1 "b":2}`,
	}
	for _, in := range bad {
		_, err := JSStringify([]byte(in))
		require.Error(t, err, "input %q", in)
	}
	var se *SyntaxError
	_, err := JSStringify([]byte(`[1,]`))
	require.True(t, errors.As(err, &se))
	require.Equal(t, 3, se.Offset)
}

func TestJSStringifyDepthAndSize(t *testing.T) {
	t.Parallel()
	ok := strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth)
	_, err := JSStringify([]byte(ok))
	require.NoError(t, err)
	deep := strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1)
	_, err = JSStringify([]byte(deep))
	require.ErrorContains(t, err, "nesting")
	deepObj := strings.Repeat(`{"a":`, MaxJSONDepth+1) + "1" + strings.Repeat("}", MaxJSONDepth+1)
	_, err = CanonicalJSON([]byte(deepObj))
	require.ErrorContains(t, err, "nesting")
	huge := make([]byte, MaxJSONBytes+1)
	_, err = JSStringify(huge)
	require.ErrorIs(t, err, ErrJSONTooLarge)
}

func TestJSStringifyManyKeysDuplicates(t *testing.T) {
	t.Parallel()
	// More than 16 members switches duplicate detection to a map; behaviour must not change.
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < 40; i++ {
		b.WriteString(`"k` + strconv.Itoa(i) + `":1,`)
	}
	b.WriteString(`"k0":2,"k39":3}`)
	got, err := JSStringify([]byte(b.String()))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(got), `{"k0":2,"k1":1,`), string(got))
	require.True(t, strings.HasSuffix(string(got), `,"k39":3}`), string(got))
	require.Equal(t, 1, strings.Count(string(got), `"k0"`))
}

func TestCanonicalJSONTable(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"sorted", `{"b":1,"a":{"d":1,"c":2}}`, `{"a":{"c":2,"d":1},"b":1}`},
		{"index keys still first", `{"b":1,"10":2,"2":3,"a":4}`, `{"2":3,"10":2,"a":4,"b":1}`},
		{"utf16 order", `{"\ud83d\ude00":1,"\uffff":2,"é":3,"Z":4,"a":5}`, "{\"Z\":4,\"a\":5,\"é\":3,\"😀\":1,\"\uffff\":2}"},
		{"arrays keep order", `[3,{"b":1,"a":2},1]`, `[3,{"a":2,"b":1},1]`},
		{"numbers", `{"x":1.0,"y":1e21}`, `{"x":1,"y":1e+21}`},
	}
	for _, tc := range cases {
		got, err := CanonicalJSON([]byte(tc.in))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, string(got), tc.name)
	}
	_, err := CanonicalJSON([]byte(`{"a":{"__proto__":1}}`))
	require.ErrorContains(t, err, "__proto__")
}

func TestCompareUTF16(t *testing.T) {
	t.Parallel()
	require.Less(t, compareUTF16("😀", "\uffff"), 0) // D83D < FFFF, unlike code point order
	require.Less(t, compareUTF16("a", "ab"), 0)
	require.Greater(t, compareUTF16("b", "ab"), 0)
	require.Equal(t, 0, compareUTF16("é😀", "é😀"))
	require.Less(t, compareUTF16("😀", "😁"), 0) // same high surrogate, low decides
	lone := string(appendSurrogate(nil, 0xD83D))
	require.Less(t, compareUTF16(lone, "😀"), 0)     // D83D vs D83D DE00: prefix
	require.Less(t, compareUTF16(lone+"a", "😀"), 0) // 'a' < DE00
}

func TestJSNumberVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	require.NotEmpty(t, v.Numbers)
	for _, n := range v.Numbers {
		var bits uint64
		for _, c := range []byte(n.Bits) {
			d, ok := jsonscan.HexVal(c)
			require.True(t, ok)
			bits = bits<<4 | uint64(d)
		}
		f := math.Float64frombits(bits)
		require.Equal(t, n.JS, string(appendJSNumber(nil, f)), "bits %s", n.Bits)
		// And through the parser: JS's own output must parse back to the same number and text.
		got, err := JSStringify([]byte(n.JS))
		require.NoError(t, err)
		require.Equal(t, n.JS, string(got))
	}
}

// FuzzJSStringify checks, for every input encoding/json accepts: the output is valid JSON, stringifying
// it again changes nothing, and it means the same as the input (numbers compared as float64). The
// canonical form must mean the same too and be a fixed point of CanonicalJSON.
func FuzzJSStringify(f *testing.F) {
	seeds := []string{
		`{}`, `[]`, `1.0`, `1e21`, `-0`, `"\ud800"`, `{"b":1,"2":2,"a":[1,{"0":0}]}`, `{"a":1,"a":2}`,
		`"\u2028\u00fc😀\\\"\n"`, `[1e-7,0.1,9007199254740993,123e-20]`, `{"\ud83d\ude00":1,"\uffff":2}`,
		`{"x":"\ud83d\u0041"}`, `[true,false,null]`, `  {"nested":{"deep":[[[{}]]]}}  `,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var want any
		if !utf8.Valid(in) || json.Unmarshal(in, &want) != nil {
			// Still must not panic; errors are fine.
			_, _ = JSStringify(in)
			_, _ = CanonicalJSON(in)
			return
		}
		out, err := JSStringify(in)
		if err != nil {
			var se *SyntaxError
			if errors.As(err, &se) && strings.Contains(se.Msg, "nesting") {
				return
			}
			t.Fatalf("JSStringify(%q) failed: %v", in, err)
		}
		if !json.Valid(out) {
			t.Fatalf("output %q of %q is not valid JSON", out, in)
		}
		again, err := JSStringify(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", in, out, again, err)
		}
		var got any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("unmarshal output %q: %v", out, err)
		}
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("meaning changed: %q -> %q", in, out)
		}
		canon, err := CanonicalJSON(in)
		if err != nil {
			if errors.Is(err, errProtoKey) {
				return
			}
			t.Fatalf("CanonicalJSON(%q): %v", in, err)
		}
		var gotC any
		if err := json.Unmarshal(canon, &gotC); err != nil || !reflect.DeepEqual(want, gotC) {
			t.Fatalf("canonical meaning changed: %q -> %q (%v)", in, canon, err)
		}
		c2, err := CanonicalJSON(canon)
		if err != nil || string(c2) != string(canon) {
			t.Fatalf("canonical not idempotent: %q -> %q (%v)", canon, c2, err)
		}
	})
}
