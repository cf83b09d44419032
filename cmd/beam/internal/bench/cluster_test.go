package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClusterConfig(t *testing.T) {
	c, err := Config{NodeURLs: []string{"http://a/", "http://b"}, NodePIDs: []int{1, 2}, Org: "bench1"}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, "http://a", c.URL)
	require.Equal(t, DefaultClusterDomain, c.Domain)
	require.Equal(t, placement{[]string{"http://a", "http://b"}, "cluster", "sbench1", []string{"http://a", "http://b"}, "cluster", "rbench1"}, c.placement())

	_, err = Config{NodeURLs: []string{"http://a", "http://b"}, Mode: ModeFederation}.withDefaults()
	require.ErrorContains(t, err, "supports modes")
	c, err = Config{NodeURLs: []string{"http://a", "http://b", "http://c"}, Mode: modeBus, Org: "bench1"}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, placement{[]string{"http://a"}, "cluster", "sbench1", []string{"http://b", "http://c"}, "cluster", "rbench1"}, c.placement())
	_, err = Config{NodeURLs: []string{"http://a", "http://b"}, NodePIDs: []int{1}}.withDefaults()
	require.ErrorContains(t, err, "node processes")
	_, err = Config{NodeURLs: []string{"http://a"}, Domain: "nodomain"}.withDefaults()
	require.Error(t, err)
}

func TestClusterNodeArgs(t *testing.T) {
	args := ClusterNodeArgs(1, []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}, "x.beam.directory")
	require.Equal(t, []string{"--domain", "x.beam.directory", "--cluster", "--node-id", "node1", "--nats-listen", "127.0.0.1:0",
		"--cluster-listen", "127.0.0.1:2", "--cluster-routes", "nats-route://127.0.0.1:1,nats-route://127.0.0.1:3",
		"--default-policy", "allow"}, args)
}
