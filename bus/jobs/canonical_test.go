package jobs

import (
	"bytes"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Vectors computed with Python 3.11 exactly as intent-bus 2.1.2 signs:
// query = "&".join(f"{quote(k, safe=”)}={quote(v, safe=”)}" for k, v in
// sorted(params, key=lambda kv: kv[0])), message =
// f"{METHOD}\n{path}[?query]\n{ts}\n{nonce}\n{body}", HMAC-SHA256 hex.
func TestCanonicalStringVectors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, method, path, rawQuery, body, want string
	}{
		{"no query", "post", "/intent", "", `{"goal":"g","payload":1}`,
			"POST\n/intent\n1700000000\nn1\n{\"goal\":\"g\",\"payload\":1}"},
		{"spaces and slash", "POST", "/claim", "namespace=default&goal=a+b%2Fc", "",
			"POST\n/claim?goal=a%20b%2Fc&namespace=default\n1700000000\nn1\n"},
		{"percent-encoded space", "POST", "/claim", "goal=a%20b", "",
			"POST\n/claim?goal=a%20b\n1700000000\nn1\n"},
		{"repeated keys keep their order", "GET", "/x", "b=2&a=z&a=y&a=", "",
			"GET\n/x?a=z&a=y&a=&b=2\n1700000000\nn1\n"},
		{"blank value and bare key", "GET", "/x", "k=&j", "",
			"GET\n/x?j=&k=\n1700000000\nn1\n"},
		{"unicode", "POST", "/claim", "goal=" + url.QueryEscape("é✓") + "&capabilities=gpu,cpu", "",
			"POST\n/claim?capabilities=gpu%2Ccpu&goal=%C3%A9%E2%9C%93\n1700000000\nn1\n"},
		{"reserved characters", "GET", "/x", "q=" + url.QueryEscape("a~b_c.d-e!*'()&=:@"), "",
			"GET\n/x?q=a~b_c.d-e%21%2A%27%28%29%26%3D%3A%40\n1700000000\nn1\n"},
		{"decoded path", "POST", "/set/with space", "", `{"value":"v"}`,
			"POST\n/set/with space\n1700000000\nn1\n{\"value\":\"v\"}"},
	}
	for _, tc := range cases {
		got := CanonicalString(tc.method, tc.path, tc.rawQuery, "1700000000", "n1", []byte(tc.body))
		require.Equal(t, tc.want, got, tc.name)
	}
	// HMAC-SHA256 keyed with the API key itself, lowercase hex (Python:
	// hmac.new(b"k", msg.encode(), hashlib.sha256).hexdigest()).
	require.Equal(t, "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8",
		Sign("key", "The quick brown fox jumps over the lazy dog"))
	// A whole signed claim, as the SDK makes it for
	// claim(goal="a b/c é", namespace="default") with key tk_secret.
	raw := url.Values{"namespace": {"default"}, "goal": {"a b/c é"}}.Encode()
	msg := CanonicalString("POST", "/claim", raw, "1700000000", "abcd", nil)
	require.Equal(t, "POST\n/claim?goal=a%20b%2Fc%20%C3%A9&namespace=default\n1700000000\nabcd\n", msg)
	require.Equal(t, "9c4e545947458c60e6a5b6fbca875240f1564fe22be5c710c83dcff51564d238", Sign("tk_secret", msg))
}

func TestQuoteMatchesPython(t *testing.T) {
	t.Parallel()
	// quote(s, safe='') for each s.
	for in, want := range map[string]string{
		"":           "",
		"abc-_.~XYZ": "abc-_.~XYZ",
		"a b":        "a%20b",
		"/":          "%2F",
		"+":          "%2B",
		"é":          "%C3%A9",
		"%":          "%25",
	} {
		require.Equal(t, want, Quote(in), in)
	}
}

func FuzzCanonicalQuery(f *testing.F) {
	for _, s := range []string{"", "a=1", "b=2&a=1&a=0", "x=%zz", "=&&=", "k", "a+b=c+d", "%C3%A9=%E2%9C%93"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q := canonicalQuery(raw)
		// Canonical output is a fixed point: only unreserved bytes,
		// %XX escapes, "=" and "&".
		require.Equal(t, q, canonicalQuery(q))
		for i := 0; i < len(q); i++ {
			c := q[i]
			ok := 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
				strings.IndexByte("-._~%=&", c) >= 0
			require.True(t, ok, "byte %q in %q", c, q)
		}
	})
}

func FuzzPublishDecoder(f *testing.F) {
	for _, s := range []string{
		`{"goal":"g","payload":{"a":1}}`,
		`{"goal":"g","payload":1,"priority":1000,"delay":0.5,"max_attempts":20,"backoff_base":1,"visibility":"public"}`,
		`{"goal":1,"payload":null}`, `[]`, `{`, ``, `{"goal":"g","payload":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"goal":"g","payload":1,"priority":"5"}`, `{"goal":"g","payload":1,"target_worker":"a:b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fs, e := decodeObject(body)
		if e != nil {
			require.Equal(t, 400, e.Status)
			return
		}
		p, e := parsePublish(fs)
		if e != nil {
			require.Contains(t, []int{400, 413}, e.Status)
			require.True(t, strings.HasPrefix(e.Code, "invalid_") || e.Code == "payload_too_large", e.Code)
			return
		}
		// An accepted request satisfies every field rule.
		require.True(t, namespaceRe.MatchString(p.namespace))
		require.GreaterOrEqual(t, p.priority, 0)
		require.LessOrEqual(t, p.priority, 1000)
		require.GreaterOrEqual(t, p.maxAttempts, 1)
		require.LessOrEqual(t, p.maxAttempts, 20)
		require.GreaterOrEqual(t, p.backoffBase, 1.0)
		require.LessOrEqual(t, len(p.payload), maxPayload)
		require.Contains(t, []string{"private", "public"}, p.visibility)
		// The stored payload is compact JSON equal to what was sent.
		var b bytes.Buffer
		require.NoError(t, compactBuf(&b, fs["payload"]))
		require.Equal(t, b.Bytes(), p.payload)
	})
}

func FuzzCanonicalHash(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[1,2]}`), []byte(`{ "b":[1,2], "a":1 }`))
	f.Add([]byte(`{"a":"x"}`), []byte(`{"a":"y"}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		// Equal bodies hash equally; a body hashes like its compact,
		// key-sorted form.
		require.Equal(t, canonicalHash(a), canonicalHash(bytes.Clone(a)))
		if fa, e := decodeObject(a); e == nil && len(fa) > 0 {
			var buf bytes.Buffer
			if compactBuf(&buf, a) == nil {
				require.Equal(t, canonicalHash(a), canonicalHash(buf.Bytes()))
			}
		}
	})
}
