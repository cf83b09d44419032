package beam

import (
	"crypto/ed25519"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/bus/jobs"
	"github.com/beamdir/beam/federation"
)

// TestEveryConfigFieldReachesTheAssembly sets each field of Config, one at
// a time, and requires the assembly's configuration New builds from it to
// change: a field New drops would be a setting an embedder cannot make.
func TestEveryConfigFieldReachesTheAssembly(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	peer := federation.Peer{Domain: "peer.beam.directory", URL: "nats://127.0.0.1:4222", PublicKey: pub}.Line()
	// Values for fields whose type alone does not give a valid one.
	values := map[string]any{
		"IntentCatalog":      []byte(`{"intents":[{"id":"task.run"}]}`),
		"Federation.Peers":   []string{peer},
		"Pipelines.Declared": []byte(`{"pipelines":[{"name":"greet","route":["bob@acme.beam.directory"]}]}`),
		"Pipelines.Policies": []byte(`{"default":{"maxAttempts":3}}`),
		"JobBus.Settings":    jobs.Config{Secret: "job-bus-secret"},
	}
	// The fields under Cluster, JobBus and Limits act only when these are
	// on, so the walk starts from a Config with them on.
	lim := DefaultLimits()
	base := Config{Cluster: Cluster{Enabled: true}, JobBus: JobBus{Enabled: true}, Limits: &lim}
	want, err := base.server()
	require.NoError(t, err)

	n := 0
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		if v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct && v.Type().Elem().PkgPath() == reflect.TypeFor[Config]().PkgPath() {
			v = v.Elem()
		}
		if _, special := values[path]; !special && v.Kind() == reflect.Struct && v.Type().PkgPath() == reflect.TypeFor[Config]().PkgPath() {
			for i := range v.NumField() {
				name := v.Type().Field(i).Name
				if path != "" {
					name = path + "." + name
				}
				walk(name, v.Field(i))
			}
			return
		}
		n++
		t.Run(path, func(t *testing.T) {
			old := reflect.ValueOf(v.Interface())
			defer v.Set(old)
			v.Set(reflect.ValueOf(otherValue(t, path, v, values)))
			got, err := base.server()
			require.NoError(t, err)
			require.False(t, reflect.DeepEqual(want, got), "Config.%s reaches no field of the assembly's configuration", path)
		})
	}
	walk("", reflect.ValueOf(&base).Elem())
	require.Greater(t, n, 40, "the walk sees Config's fields")
}

// otherValue is a value for the field at path other than v's.
func otherValue(t *testing.T, path string, v reflect.Value, values map[string]any) any {
	t.Helper()
	if x, ok := values[path]; ok {
		return x
	}
	switch x := v.Interface().(type) {
	case bool:
		return !x
	case int:
		return x + 1
	case string:
		return x + "x"
	case time.Duration:
		return x + time.Second
	case []string:
		return append(x, "x")
	case []time.Duration:
		return append(x, time.Second)
	case *slog.Logger:
		return slog.New(slog.DiscardHandler)
	case func() time.Time:
		return time.Now
	}
	t.Fatalf("Config.%s: no value for type %T; add one to the test", path, v.Interface())
	return nil
}
