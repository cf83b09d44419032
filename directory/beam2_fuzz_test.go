package directory

import (
	"encoding/json"
	"testing"
)

func FuzzParseCatalog(f *testing.F) {
	f.Add([]byte(testCatalog))
	f.Add([]byte(`{"intents":[]}`))
	f.Add([]byte(`{"intents":[{"id":"a","payload":{"x":{"enum":[null,1,"a"]}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCatalog(data)
		if err != nil {
			return
		}
		for _, id := range c.Intents() {
			_ = c.Validate(id, json.RawMessage(`{"x":"y","message":[1]}`))
		}
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
	})
}
