package agents_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/beamdir/beam/agents"
	"github.com/stretchr/testify/require"
)

func TestErrorFromResponse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status        int
		body          string
		code, message string
	}{
		{http.StatusForbidden, `{"error":"denied by policy","errorCode":"FORBIDDEN","reason":"x"}`, "FORBIDDEN", "denied by policy"},
		{http.StatusNotFound, "404 page not found\n", "NOT_FOUND", "404 page not found"},
		{http.StatusBadGateway, "", "HTTP_502", "Bad Gateway"},
		{http.StatusServiceUnavailable, `{"errorCode":"BUSY"}`, "BUSY", "Service Unavailable"},
		{http.StatusInternalServerError, strings.Repeat("x", 300), "HTTP_500", strings.Repeat("x", 200)},
	}
	for _, c := range cases {
		e := agents.ErrorFromResponse(&http.Response{StatusCode: c.status}, []byte(c.body))
		require.Equal(t, c.status, e.Status, c.body)
		require.Equal(t, c.code, e.Code, c.body)
		require.Equal(t, c.message, e.Message, c.body)
		require.Equal(t, c.code, agents.ErrorCode(e))
	}
}
