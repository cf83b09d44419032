package directory

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

func FuzzParseCatalog(f *testing.F) {
	f.Add([]byte(testCatalog))
	f.Add([]byte(`{"intents":[]}`))
	f.Add([]byte(`{"intents":[{"id":"a","payload":{"x":{"enum":[null,1,"a"]}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCatalog(data)
		if err != nil {
			require.Nil(t, c)
			return
		}
		// Round trip: the catalog as served (GET /intents/catalog, without
		// its mode) parses to the same catalog, which judges payloads alike.
		var served map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(c.raw, &served))
		delete(served, "mode")
		again, err := json.Marshal(served)
		require.NoError(t, err)
		c2, err := ParseCatalog(again)
		require.NoError(t, err, "the served catalog %s does not parse", again)
		require.Equal(t, string(c.raw), string(c2.raw))
		require.Equal(t, c.Intents(), c2.Intents())
		payloads := []string{`{"x":"y","message":[1]}`, `{}`, `{"x":1,"n":2.5,"b":true,"o":{},"a":[]}`, `[]`}
		for _, id := range append(c.Intents(), "\xff") {
			for _, p := range payloads {
				e1, e2 := c.Validate(id, json.RawMessage(p)), c2.Validate(id, json.RawMessage(p))
				require.Equal(t, fmt.Sprint(e1), fmt.Sprint(e2), "intent %q payload %s", id, p)
			}
		}
		require.Error(t, c.Validate("\xff", nil), "an unknown intent type is refused")
	})
}

func FuzzDecodeJWSIntent(f *testing.F) {
	f.Add("not.a.jws")
	f.Add("eyJhbGciOiJub25lIn0.eyJ9.")
	f.Add("a.eyJ0byI6ImIiLCJmcm9tIjoiYSIsImludGVudCI6IngiLCJwYXlsb2FkIjp7fSwibm9uY2UiOiJuIiwidGltZXN0YW1wIjoidCJ9.c")
	f.Fuzz(func(t *testing.T, token string) {
		fr, rerr := decodeJWSIntent(token)
		if (fr == nil) == (rerr == nil) {
			t.Fatalf("frame %v and error %v", fr, rerr)
		}
		if rerr != nil {
			// A bad envelope is the client's mistake: a 400 in the
			// Beam error shape, never a 500.
			require.Equal(t, http.StatusBadRequest, rerr.HTTPStatus(), "%v", rerr)
			require.NotEmpty(t, rerr.httpErr().Code)
			return
		}
		// Round trip: the frame read from the envelope re-encodes to a
		// frame that decodes to the same intent.
		d, err := fr.DeliveryJSON()
		require.NoError(t, err)
		g, err := wire.DecodeIntentFrame(d)
		require.NoError(t, err, "%s", d)
		require.Equal(t, fr.Nonce, g.Nonce)
		require.Equal(t, fr.From, g.From)
		require.Equal(t, fr.To, g.To)
		require.Equal(t, fr.Intent, g.Intent)
		require.Equal(t, string(fr.Payload), string(g.Payload))
	})
}
