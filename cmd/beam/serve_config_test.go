package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
)

// processFlags are the serve flags that say where and how long the beam
// process serves the directory, not what the directory is: an embedder
// decides them with the listeners it passes to beam.Server.Serve and
// ServeJobBus and the context it gives Shutdown. --demo runs client agents
// beside the directory. --intent-listen's address is the job bus listener;
// that it turns the job bus on or off reaches beam.Config (JobBus.Enabled,
// checked below with an empty value).
var processFlags = map[string]string{
	"listen":           "the HTTP listener's address",
	"shutdown-timeout": "the graceful shutdown's bound",
	"demo":             "demo agents are clients of the directory",
}

// TestServeFlagsReachTheConfig sets each flag of beam serve to a value other
// than its default and requires the beam.Config built from the flags to
// differ from the one built without it: a flag that reaches no field of
// beam.Config would be a side door around the embedding API.
func TestServeFlagsReachTheConfig(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	// Values for flags whose type alone does not give a valid non-default
	// value.
	values := map[string]string{
		"data-dir":           filepath.Join(dir, "data"),
		"sqlite-synchronous": "NORMAL",
		"log-level":          "debug",
		"log-format":         "json",
		"default-policy":     "deny",
		"domain":             "acme.beam.directory",
		"nats-listen":        "127.0.0.1:0",
		"nats-url":           "nats://127.0.0.1:4222",
		"peer":               "peer.beam.directory=nats://127.0.0.1:4222#" + "AAAA",
		"intent-catalog":     file("catalog.json", `{"intents":[]}`),
		"mesh-policies":      file("policies.json", `{}`),
		"pipelines":          file("pipelines.json", `{"pipelines":[]}`),
		"bus-retry-schedule": "1s,2s",
		"intent-listen":      "",
		"cluster-routes":     "nats-route://127.0.0.1:6222",
	}
	// Flags that are refused without another one.
	needs := map[string][]string{
		"node-id":                {"--cluster"},
		"cluster-listen":         {"--cluster"},
		"cluster-routes":         {"--cluster"},
		"cluster-replicas":       {"--cluster"},
		"cluster-takeover-grace": {"--cluster"},
	}
	env := func(string) string { return "" }
	build := func(args ...string) beam.Config {
		t.Helper()
		var f serveFlags
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.register(fs)
		require.NoError(t, fs.Parse(args))
		cfg, err := f.config(env, io.Discard)
		require.NoError(t, err, "%v", args)
		return cfg
	}

	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f.register(fs)
	n := 0
	fs.VisitAll(func(fl *flag.Flag) {
		n++
		if _, ok := processFlags[fl.Name]; ok {
			return
		}
		t.Run(fl.Name, func(t *testing.T) {
			v, ok := values[fl.Name]
			if !ok {
				v = otherValue(t, fl)
			}
			base := build(needs[fl.Name]...)
			with := build(append(append([]string{}, needs[fl.Name]...), "--"+fl.Name+"="+v)...)
			require.False(t, reflect.DeepEqual(base, with), "--%s=%q changes no field of beam.Config", fl.Name, v)
		})
	})
	require.Greater(t, n, 40, "the walk sees serve's flags")
}

// otherValue is a value of fl's type other than its default.
func otherValue(t *testing.T, fl *flag.Flag) string {
	t.Helper()
	g, ok := fl.Value.(flag.Getter)
	if !ok { // a rate flag
		return "7/1m"
	}
	switch d := g.Get().(type) {
	case bool:
		return strconv.FormatBool(!d)
	case int:
		return strconv.Itoa(d + 1)
	case time.Duration:
		return (d + time.Second).String()
	case string:
		return d + "x"
	}
	t.Fatalf("--%s: no value for type %T; add one to the test", fl.Name, g.Get())
	return ""
}

// TestClusterFlagsAreRefusedWithoutCluster: a cluster flag given without
// --cluster (even at its default value), or a takeover grace too short to
// tell a restart from a loss, is an error, not a setting silently dropped.
func TestClusterFlagsAreRefusedWithoutCluster(t *testing.T) {
	for _, args := range [][]string{
		{"--node-id=n1"},
		{"--cluster-replicas=3"},
		{"--cluster-takeover-grace=1m"},
		{"--cluster-takeover-grace=5s"},
		{"--cluster-replicas=0"},
		{"--cluster", "--cluster-takeover-grace=500ms"},
	} {
		var c clusterFlags
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		c.register(fs)
		require.NoError(t, fs.Parse(args))
		_, err := c.config()
		require.Error(t, err, "%v", args)
	}
	var c clusterFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	c.register(fs)
	require.NoError(t, fs.Parse([]string{"--cluster", "--cluster-takeover-grace=2m"}))
	cfg, err := c.config()
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, cfg.TakeoverGrace)
}
