package registry

import (
	"net/http"
	"strings"
	"testing"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/stretchr/testify/require"
)

// TestBadInputNeverFails500 throws malformed bodies at every route that
// reads one and checks the documented error shapes.
func TestBadInputNeverFails500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.register("pat@acme.beam.directory")
	id := esc(a.beamID)
	routes := []struct{ method, path string }{
		{"POST", "/agents/register"},
		{"POST", "/agents/" + id + "/keys/rotate"},
		{"POST", "/agents/" + id + "/keys/revoke"},
		{"PATCH", "/agents/" + id + "/visibility"},
		{"PATCH", "/agents/" + id + "/config"},
		{"POST", "/acl"},
	}
	bodies := []struct {
		body   string
		status int
		code   string
	}{
		{`{`, 400, "INVALID_JSON"},
		{`{"a":}`, 400, "INVALID_JSON"},
		{`not json`, 400, "INVALID_JSON"},
		{``, 400, "INVALID_JSON"},
		{`[]`, 400, "INVALID_BODY"},
		{`42`, 400, "INVALID_BODY"},
		{`{"x":"` + strings.Repeat("y", maxBodyBytes+10) + `"}`, 413, "PAYLOAD_TOO_LARGE"},
	}
	for _, rt := range routes {
		for _, bd := range bodies {
			r := b.call(rt.method, rt.path, bd.body, "x-api-key", a.apiKey)
			requireErr(t, r, bd.status, bd.code)
		}
		// Wrong types everywhere: a 4xx, never a 5xx.
		for _, body := range []string{
			`{"beamId":1,"displayName":[],"publicKey":{},"capabilities":{},"timestamp":5,"nonce":true,"signature":[]}`,
			`{"newPublicKey":1,"publicKey":false,"visibility":{},"httpEndpoint":[],"dhPublicKey":3}`,
			`{"targetBeamId":[],"intentType":{},"allowedFrom":1,"effect":2}`,
			`{"timestamp":"yesterday","nonce":"` + strings.Repeat("n", 300) + `","signature":"x"}`,
		} {
			r := b.call(rt.method, rt.path, body, "x-api-key", a.apiKey)
			require.GreaterOrEqual(t, r.status, 400, rt.path+" "+body)
			require.Less(t, r.status, 500, rt.path+" "+body+" "+string(r.raw))
			require.NotEmpty(t, r.str("errorCode"), string(r.raw))
		}
	}
	// Signed-request freshness errors.
	r := b.call("POST", "/agents/"+id+"/keys/rotate",
		map[string]any{"newPublicKey": newIdentity(t).pubB64, "timestamp": "yesterday", "nonce": "n", "signature": "c2ln"})
	requireErr(t, r, http.StatusBadRequest, "INVALID_TIMESTAMP")
	r = b.call("POST", "/agents/"+id+"/keys/rotate",
		map[string]any{"newPublicKey": newIdentity(t).pubB64, "timestamp": b.ts(), "nonce": "n", "signature": "!!"})
	requireErr(t, r, http.StatusUnauthorized, "INVALID_SIGNATURE")
	// Path values.
	requireErr(t, b.call("POST", "/agents/%20/keys/rotate", `{}`), http.StatusBadRequest, "INVALID_BEAM_ID")
	requireErr(t, b.call("GET", "/agents/"+strings.Repeat("a", 300)+"@beam.directory", nil), http.StatusBadRequest, "INVALID_BEAM_ID")
	require.Equal(t, 1, b.reg.Count())
}

func TestAPIKeyParsing(t *testing.T) {
	t.Parallel()
	key, hash, err := newAPIKey("z@beam.directory")
	require.NoError(t, err)
	id, ok := beamIDFromAPIKey(key)
	require.True(t, ok)
	require.Equal(t, "z@beam.directory", id)
	require.True(t, apiKeyMatches(key, hash))
	require.False(t, apiKeyMatches(key+"x", hash))
	require.False(t, apiKeyMatches(key, ""))
	for _, bad := range []string{"", "bk_", "bk_.", "bk_!!!.x", "xx_abc.def", "bk_" + strings.Repeat("a", 600) + ".x", "bk_YQ"} {
		_, ok := beamIDFromAPIKey(bad)
		require.False(t, ok, bad)
	}
}

// FuzzDecodeRegister checks that the registration decoder never panics and
// only fails with documented 4xx errors.
func FuzzDecodeRegister(f *testing.F) {
	pub := "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE="
	f.Add([]byte(`{"beamId":"a@beam.directory","displayName":"A","capabilities":["x"],"publicKey":"` + pub + `"}`))
	f.Add([]byte(`{"beam_id":"a@acme.beam.directory","display_name":"A","public_key":"` + pub + `","org":"acme","email":"a@b.co"}`))
	f.Add([]byte(`{"displayName":"A","publicKey":"` + pub + `","httpEndpoint":"https://x.y/z","dhPublicKey":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","visibility":"unlisted"}`))
	f.Add([]byte(`{"displayName":"A","publicKey":"` + pub + `","timestamp":"2026-01-01T00:00:00Z","nonce":"n","signature":"s"}`))
	f.Add([]byte(`{"displayName":null,"publicKey":1}`))
	f.Add([]byte(`[`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeRegister(data, true)
		if err != nil {
			ae, ok := err.(*httpjson.Error)
			if !ok {
				t.Fatalf("non-api error %T: %v", err, err)
			}
			if ae.Status < 400 || ae.Status >= 500 || ae.Code == "" {
				t.Fatalf("bad error %+v", ae)
			}
			return
		}
		if req.displayName == "" || len(req.pub) != 32 {
			t.Fatalf("accepted an incomplete request: %+v", req)
		}
		if req.beamID != "" {
			if _, err := parseBeamID(req.beamID); err != nil {
				t.Fatalf("accepted an invalid beam id %q", req.beamID)
			}
		}
	})
}
