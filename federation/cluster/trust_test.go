package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/federation"
)

// WriteNodeDirs gives every node the same directory key and route
// password, its own certificate from one CA, secrets readable by the owner
// only; it never overwrites a cluster's credentials, and LoadTrust names
// what is missing and how to make it.
func TestWriteNodeDirs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dirs := []string{filepath.Join(root, "node1"), filepath.Join(root, "node2")}
	require.NoError(t, WriteNodeDirs("acme.beam.directory", dirs))

	trusts := make([]*Trust, len(dirs))
	for i, d := range dirs {
		for _, f := range []string{CertKeyFile, SecretFile, federation.KeyFile, NodeIDFile, jobSecretFile} {
			st, err := os.Stat(filepath.Join(d, f))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f)
		}
		var err error
		trusts[i], err = LoadTrust(d)
		require.NoError(t, err)
		id, err := LoadOrCreateNodeID(d)
		require.NoError(t, err)
		require.Equal(t, []string{"node1", "node2"}[i], id)
	}
	require.Equal(t, trusts[0].secret, trusts[1].secret)
	k0, err := os.ReadFile(filepath.Join(dirs[0], federation.KeyFile))
	require.NoError(t, err)
	k1, err := os.ReadFile(filepath.Join(dirs[1], federation.KeyFile))
	require.NoError(t, err)
	require.Equal(t, k0, k1)
	s0, err := os.ReadFile(filepath.Join(dirs[0], jobSecretFile))
	require.NoError(t, err)
	s1, err := os.ReadFile(filepath.Join(dirs[1], jobSecretFile))
	require.NoError(t, err)
	require.Equal(t, s0, s1, "every node's job bus takes the same BUS_SECRET")

	// Node 2's certificate passes node 1's route checks, both ways.
	c1 := trusts[0].tlsConfig("acme.beam.directory")
	leaf := trusts[1].cert.Leaf
	require.NotNil(t, leaf)
	_, err = leaf.Verify(x509.VerifyOptions{Roots: c1.ClientCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	_, err = leaf.Verify(x509.VerifyOptions{Roots: c1.RootCAs, DNSName: c1.ServerName})
	require.NoError(t, err)
	require.Equal(t, tls.RequireAndVerifyClientCert, c1.ClientAuth)

	// A second init over the same directories is refused.
	require.ErrorContains(t, WriteNodeDirs("acme.beam.directory", dirs), "exists")

	// The data directory of a node that ran before keeps its node ID and
	// gives its directory key to the others.
	old, other := t.TempDir(), t.TempDir()
	oldID, err := LoadOrCreateNodeID(old)
	require.NoError(t, err)
	oldKey, _, err := federation.LoadOrCreateKey(old)
	require.NoError(t, err)
	require.NoError(t, WriteNodeDirs("acme.beam.directory", []string{old, other}))
	id, err := LoadOrCreateNodeID(old)
	require.NoError(t, err)
	require.Equal(t, oldID, id)
	otherKey, _, err := federation.LoadOrCreateKey(other)
	require.NoError(t, err)
	require.Equal(t, oldKey, otherKey)

	_, err = LoadTrust(t.TempDir())
	require.ErrorIs(t, err, errNoTrust)
	require.ErrorContains(t, err, "beam cluster init --nodes N --domain D --out DIR")
}
