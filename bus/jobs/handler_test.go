package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// handlerBundle is a Service on a real log in a temporary directory,
// served in-process.
type handlerBundle struct {
	svc *Service
	log *tracing.Log
	h   http.Handler
}

func setupHandler(t testing.TB) *handlerBundle {
	t.Helper()
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Synchronous: "NORMAL"})
	require.NoError(t, err)
	svc, err := Open(context.Background(), Config{Log: lg, Secret: "main", AdminSecret: "adm", ReapInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = svc.Close()
		_ = lg.Close()
	})
	return &handlerBundle{svc: svc, log: lg, h: svc.Handler()}
}

func (b *handlerBundle) serve(method, target string, body []byte, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, req)
	return w
}

// requireShape checks §10 headers and, on errors, the §11 shape.
func requireShape(t testing.TB, w *httptest.ResponseRecorder) string {
	t.Helper()
	require.Equal(t, "2.1", w.Header().Get("X-Intent-Version"))
	require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	if w.Code < 400 {
		return ""
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), w.Body.String())
	require.NotEmpty(t, e.Error.Code)
	require.NotEmpty(t, e.Error.Message)
	return e.Error.Code
}

func TestDatabaseBusyWhenTheLogCannotCommit(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	require.NoError(t, b.log.Close())
	w := b.serve("POST", "/intent", []byte(`{"goal":"g","payload":1}`), map[string]string{"X-API-KEY": "main"})
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "database_busy", requireShape(t, w))
	require.Equal(t, "1", w.Header().Get("Retry-After"))
}

func TestInvalidPayloadNesting(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	deep := strings.Repeat("[", 40) + strings.Repeat("]", 40)
	w := b.serve("POST", "/intent", []byte(`{"goal":"g","payload":`+deep+`}`), map[string]string{"X-API-KEY": "main"})
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Equal(t, "invalid_payload", requireShape(t, w))
}

// FuzzHandler sends arbitrary methods, paths, queries, bodies and headers:
// every answer has the RFC's headers, every error its shape, and none is a
// 500.
func FuzzHandler(f *testing.F) {
	seeds := []struct{ method, path, body, key string }{
		{"POST", "/intent", `{"goal":"g","payload":{"a":1}}`, "main"},
		{"POST", "/claim?namespace=default&goal=g", ``, "main"},
		{"POST", "/fulfill/abc", `{"claim_token":"x","result":"r","result_type":"text"}`, "main"},
		{"POST", "/extend_claim/abc", `{"claim_token":"x","seconds":1e309}`, "main"},
		{"POST", "/fail/abc", `{"claim_token":1}`, "main"},
		{"POST", "/set/k%2Fz", `{"value":{"a":[1]},"ttl":5}`, "main"},
		{"GET", "/get/k", ``, "main"},
		{"GET", "/result/zz", ``, "main"},
		{"POST", "/admin/purge", `{"confirm":true}`, ""},
		{"PUT", "/intent", `{}`, "main"},
		{"POST", "/intent", `{"goal":"g","payload":1,"priority":1e3,"delay":"1"}`, "main"},
		{"POST", "/intent", "\xff\xfe", "main"},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, []byte(s.body), s.key, "")
	}
	f.Add("POST", "/claim", []byte{}, "main", "X-Signature")
	b := setupHandler(f)
	f.Fuzz(func(t *testing.T, method, path string, body []byte, key, sigHeader string) {
		if !validMethod(method) || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") {
			return
		}
		if _, err := http.NewRequest(method, "http://x"+path, nil); err != nil {
			return
		}
		hdr := map[string]string{"X-API-KEY": key, "X-Admin-Token": "adm"}
		if sigHeader != "" {
			hdr[sigHeader] = "0"
		}
		w := b.serve(method, path, body, hdr)
		require.NotEqual(t, http.StatusInternalServerError, w.Code, "%s %s %q -> %s", method, path, body, w.Body.String())
		requireShape(t, w)
	})
}

func validMethod(m string) bool {
	switch m {
	case "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS":
		return true
	}
	return false
}
