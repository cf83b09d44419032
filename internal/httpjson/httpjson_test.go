package httpjson

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteDoesNotEscapeHTMLAndSetsHeaders(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Write(rec, http.StatusCreated, map[string]string{"q": "<a & b>"})
	require.Equal(t, http.StatusCreated, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))
	require.Equal(t, `{"q":"<a & b>"}`+"\n", rec.Body.String())
}

func TestWriteUnencodableIsInternalError(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Write(rec, http.StatusOK, math.NaN())
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	var body struct{ ErrorCode string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Equal(t, "INTERNAL_ERROR", body.ErrorCode)
}

func TestError(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusBadRequest, "INVALID_INTENT", "bad")
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.JSONEq(t, `{"error":"bad","errorCode":"INVALID_INTENT"}`, rec.Body.String())
}

func TestBearerAndAPIKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		header, value string
		bearer        string
		bearerOK      bool
		key           string
		keyOK         bool
	}{
		{"Authorization", "Bearer tok", "tok", true, "", false},
		{"Authorization", "bearer  tok  ", "tok", true, "", false},
		{"Authorization", "BEARER bk_x", "bk_x", true, "bk_x", true},
		{"Authorization", "Bearer ", "", false, "", false},
		{"Authorization", "Basic abc", "", false, "", false},
		{"Authorization", "Bearertok", "", false, "", false},
		{"X-Api-Key", " bk_y ", "", false, "bk_y", true},
		{"X-Api-Key", "anything", "", false, "anything", true},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set(c.header, c.value)
		tok, ok := Bearer(r)
		require.Equal(t, c.bearer, tok, "%s: %q", c.header, c.value)
		require.Equal(t, c.bearerOK, ok, "%s: %q", c.header, c.value)
		key, ok := APIKey(r)
		require.Equal(t, c.key, key, "%s: %q", c.header, c.value)
		require.Equal(t, c.keyOK, ok, "%s: %q", c.header, c.value)
	}
}
