package cluster

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCapturedKeepsStatusHeadersAndBody(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Test", "1")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"errorCode":"MESSAGE_NOT_FOUND"}`))
		w.WriteHeader(http.StatusOK) // ignored: the first status counts
	})
	c := serveCaptured(h, httptest.NewRequest(http.MethodGet, "/v1/beam/messages/x", nil))
	require.Equal(t, http.StatusNotFound, c.code())
	require.Equal(t, "1", c.header.Get("X-Test"))
	require.JSONEq(t, `{"errorCode":"MESSAGE_NOT_FOUND"}`, string(c.body))
	require.False(t, c.overflow)

	out := httptest.NewRecorder()
	c.copyTo(out)
	require.Equal(t, http.StatusNotFound, out.Code)
	require.Equal(t, "1", out.Header().Get("X-Test"))
}

func TestCapturedBoundsTheBody(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("a"), maxCapturedBody-1))
		_, _ = w.Write([]byte("bb"))
	})
	c := serveCaptured(h, httptest.NewRequest(http.MethodGet, "/v1/beam/poll", nil))
	require.Equal(t, http.StatusOK, c.code())
	require.True(t, c.overflow)
	require.Len(t, c.body, maxCapturedBody)

	out := httptest.NewRecorder()
	c.copyTo(out)
	require.Equal(t, http.StatusBadGateway, out.Code)
	require.Contains(t, out.Body.String(), "BUS_ANSWER_TOO_LARGE")
}
