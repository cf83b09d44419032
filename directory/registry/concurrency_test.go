package registry

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConcurrentRegistrationOfOneID: exactly one of several racing
// registrations of the same Beam ID with different keys wins.
func TestConcurrentRegistrationOfOneID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 6
	statuses := make([]int, n)
	bodies := make([]map[string]any, n)
	for i := range bodies {
		bodies[i] = map[string]any{"beamId": "race@acme.beam.directory", "displayName": "Race", "publicKey": newIdentity(t).pubB64}
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			statuses[i] = b.call("POST", "/agents/register", bodies[i]).status
		}(i)
	}
	wg.Wait()
	created, taken := 0, 0
	for _, s := range statuses {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			taken++
		}
	}
	require.Equal(t, 1, created, statuses)
	require.Equal(t, n-1, taken, statuses)
	require.EqualValues(t, 1, b.dbInt(`SELECT COUNT(*) FROM agents`))
	require.EqualValues(t, 1, b.dbInt(`SELECT COUNT(*) FROM agent_keys`))
}

// BenchmarkAllowed measures a policy decision against a target with a few
// rules (the router calls it once per intent).
func BenchmarkAllowed(b *testing.B) {
	tb := setup(b)
	a := tb.register("bench@acme.beam.directory")
	for _, from := range []string{"*@beta.beam.directory", "x@gamma.beam.directory", "*.delta.beam.directory"} {
		r := tb.call("POST", "/acl", map[string]any{"targetBeamId": a.beamID, "intentType": "task", "allowedFrom": from}, "x-api-key", a.apiKey)
		require.Equal(b, http.StatusCreated, r.status)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if ok, _ := tb.reg.Allowed("y@beta.beam.directory", a.beamID, "task"); !ok {
			b.Fatal("denied")
		}
	}
}

// BenchmarkAuthenticateAPIKey measures API-key authentication (WebSocket
// upgrades, HTTP sends).
func BenchmarkAuthenticateAPIKey(b *testing.B) {
	tb := setup(b)
	a := tb.register("bench@acme.beam.directory")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := tb.reg.AuthenticateAPIKey(a.apiKey); !ok {
			b.Fatal("rejected")
		}
	}
}

// BenchmarkGetAndTouch measures the per-intent registry work of the router.
func BenchmarkGetAndTouch(b *testing.B) {
	tb := setup(b)
	a := tb.register("bench@acme.beam.directory")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := tb.reg.Get(a.beamID); !ok {
			b.Fatal("missing")
		}
		tb.reg.Touch(a.beamID)
	}
}
