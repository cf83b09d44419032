package httpjson

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func serve(t *testing.T, a Adapter, err error) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	a.Handler(func(http.ResponseWriter, *http.Request) error { return err }).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	return rec
}

func TestAdapterWritesErrorInBeamShape(t *testing.T) {
	t.Parallel()
	e := Errorf(http.StatusConflict, "LEASE_CONFLICT", "lease %s is held", "l1").With("reason", "LEASE_EXPIRED")
	e.RetryAfter = 1500 * time.Millisecond
	rec := serve(t, Adapter{}, fmt.Errorf("ack: %w", e))
	require.Equal(t, http.StatusConflict, rec.Code)
	require.Equal(t, "2", rec.Header().Get("Retry-After"))
	require.Equal(t, `{"error":"lease l1 is held","errorCode":"LEASE_CONFLICT","reason":"LEASE_EXPIRED"}`+"\n", rec.Body.String())
}

func TestAdapterHidesOtherErrorsAndLogsThem(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	a := Adapter{Log: slog.New(slog.NewTextHandler(&logs, nil))}
	rec := serve(t, a, errors.New("disk /secret/path full"))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.JSONEq(t, `{"error":"internal error","errorCode":"INTERNAL_ERROR"}`, rec.Body.String())
	require.Contains(t, logs.String(), "disk /secret/path full")

	logs.Reset()
	rec = serve(t, a, Internal("send failed", errors.New("sqlite busy")))
	require.JSONEq(t, `{"error":"send failed","errorCode":"INTERNAL_ERROR"}`, rec.Body.String())
	require.Contains(t, logs.String(), "sqlite busy")
}

func TestAdapterNilWritesNothing(t *testing.T) {
	t.Parallel()
	rec := serve(t, Adapter{}, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Empty(t, rec.Body.String())
}

func TestAdapterTakesTheProtocolShape(t *testing.T) {
	t.Parallel()
	shape := func(w http.ResponseWriter, e *Error) {
		Write(w, e.Status, map[string]any{"error": map[string]string{"code": e.Code, "message": e.Message}})
	}
	a := Adapter{Shape: shape, Fault: New(http.StatusInternalServerError, "internal_error", "Internal error."),
		Log: slog.New(slog.DiscardHandler)}
	rec := serve(t, a, New(http.StatusNotFound, "not_found", "No such intent."))
	require.JSONEq(t, `{"error":{"code":"not_found","message":"No such intent."}}`, rec.Body.String())
	rec = serve(t, a, errors.New("boom"))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.JSONEq(t, `{"error":{"code":"internal_error","message":"Internal error."}}`, rec.Body.String())
}

func TestErrorUnwrapsItsCause(t *testing.T) {
	t.Parallel()
	e := Internal("read failed", fs.ErrNotExist)
	require.ErrorIs(t, e, fs.ErrNotExist)
	var got *Error
	require.ErrorAs(t, fmt.Errorf("wrapped: %w", e), &got)
	require.Equal(t, http.StatusInternalServerError, got.Status)
	require.Equal(t, CodeInternal, got.Code)
}
