package cluster

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/beamdir/beam/federation"
)

// The route connections between the nodes' embedded NATS servers are TLS
// 1.3 in both directions, each side presenting a node certificate signed by
// the cluster's own CA, and carry the cluster's route password. `beam
// cluster init` (WriteNodeDirs) makes them once for every node, with the
// shared directory key; a node loads them from its data directory
// (LoadTrust) and refuses to open a route listener without them.

// Files of a node's route credentials in its data directory.
const (
	// caFile is the cluster CA's certificate (PEM).
	caFile = "cluster-ca.pem"
	// certFile is this node's certificate, signed by the cluster CA (PEM).
	certFile = "cluster-node.pem"
	// CertKeyFile is the private key of certFile (PEM, PKCS #8, 0600).
	CertKeyFile = "cluster-node.key"
	// SecretFile is the route password every node presents and requires
	// (0600).
	SecretFile = "cluster-route.secret"
)

// trustFiles are the files LoadTrust reads.
var trustFiles = []string{caFile, certFile, CertKeyFile, SecretFile}

// errNoTrust is returned when a data directory lacks the route credentials.
var errNoTrust = errors.New("cluster: no route credentials")

// certValidity is how long the CA and node certificates are valid.
const certValidity = 20 * 365 * 24 * time.Hour

// Trust is a node's route credentials: the cluster CA, its own
// certificate and the route password.
type Trust struct {
	roots  *x509.CertPool
	cert   tls.Certificate
	secret string
}

// LoadTrust reads the route credentials from dataDir. Without them it
// returns an error wrapping errNoTrust that says how to make them.
func LoadTrust(dataDir string) (*Trust, error) {
	var missing []string
	for _, f := range trustFiles {
		if _, err := os.Stat(filepath.Join(dataDir, f)); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w in %s (missing %s): create every node's data directory with "+
			"`beam cluster init --nodes N --domain D --out DIR` and start each node with --data-dir DIR/nodeI",
			errNoTrust, dataDir, strings.Join(missing, ", "))
	}
	caPEM, err := os.ReadFile(filepath.Join(dataDir, caFile))
	if err != nil {
		return nil, fmt.Errorf("cluster: read CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster: %s holds no certificate", filepath.Join(dataDir, caFile))
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dataDir, certFile), filepath.Join(dataDir, CertKeyFile))
	if err != nil {
		return nil, fmt.Errorf("cluster: node certificate: %w", err)
	}
	secret, err := os.ReadFile(filepath.Join(dataDir, SecretFile))
	if err != nil {
		return nil, fmt.Errorf("cluster: read route secret: %w", err)
	}
	s := strings.TrimSpace(string(secret))
	if len(s) < 32 {
		return nil, fmt.Errorf("cluster: %s: the route secret is shorter than 32 characters", filepath.Join(dataDir, SecretFile))
	}
	return &Trust{roots: roots, cert: cert, secret: s}, nil
}

// routeServerName is the name every node certificate of domain's cluster
// carries and every dialing node checks, whatever address it dialed: the
// CA, which belongs to this cluster alone, is what admits a node.
func routeServerName(domain string) string { return "route." + domain }

// tlsConfig is the route TLS configuration of a node of domain: TLS 1.3,
// its certificate presented and the other side's verified against the
// cluster CA, both when it accepts and when it dials.
func (t *Trust) tlsConfig(domain string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.roots,
		ClientCAs:    t.roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ServerName:   routeServerName(domain),
	}
}

// WriteNodeDirs makes the data directories of a cluster of domain, one
// per entry of dirs (created 0700 if missing): each gets the node ID
// node1, node2, … (a node ID it has is kept), the directory key of the
// first (created if it has none), the cluster CA's certificate, its own
// node certificate and key, and the route password. The CA's private key
// is not kept. It refuses to overwrite route credentials that exist.
func WriteNodeDirs(domain string, dirs []string) error {
	if err := federation.ValidDomain(domain); err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	if len(dirs) == 0 {
		return errors.New("cluster init: no node")
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("cluster init: %w", err)
		}
		for _, f := range trustFiles {
			if _, err := os.Stat(filepath.Join(d, f)); err == nil {
				return fmt.Errorf("cluster init: %s exists; remove the node directories to start a new cluster", filepath.Join(d, f))
			}
		}
	}
	caPub, caKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("cluster init: CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "beam cluster CA " + domain},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := createCert(caTmpl, caTmpl, caPub, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("cluster init: route secret: %w", err)
	}
	secret := hex.EncodeToString(raw)
	for i, d := range dirs {
		id := fmt.Sprintf("node%d", i+1)
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return fmt.Errorf("cluster init: node key: %w", err)
		}
		der, err := createCert(&x509.Certificate{
			Subject:     pkix.Name{CommonName: id + " " + domain},
			DNSNames:    []string{routeServerName(domain)},
			NotBefore:   now.Add(-time.Hour),
			NotAfter:    now.Add(certValidity),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}, ca, pub, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return fmt.Errorf("cluster init: %w", err)
		}
		_, err = os.Stat(filepath.Join(d, NodeIDFile))
		keepID := err == nil
		files := []struct {
			name string
			data []byte
			mode os.FileMode
		}{
			{NodeIDFile, []byte(id + "\n"), 0o600},
			{caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644},
			{certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644},
			{CertKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
			{SecretFile, []byte(secret + "\n"), 0o600},
		}
		for _, f := range files {
			if f.name == NodeIDFile && keepID {
				continue
			}
			if err := writeNew(filepath.Join(d, f.name), f.data, f.mode); err != nil {
				return err
			}
		}
	}
	if err := federation.ShareKey(dirs); err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	return shareJobSecret(dirs)
}

// jobSecretFile holds the job bus's BUS_SECRET in a data directory.
const jobSecretFile = "intent.secret"

// shareJobSecret gives every node the same job bus secret: the home
// authenticates every node's job bus clients (forward.go). The first
// secret one of dirs has is copied to the others that have none; without
// one, a new one is written to all.
func shareJobSecret(dirs []string) error {
	var secret []byte
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, jobSecretFile)); err == nil && len(bytes.TrimSpace(b)) > 0 {
			secret = b
			break
		}
	}
	if secret == nil {
		raw := make([]byte, 24)
		if _, err := rand.Read(raw); err != nil {
			return fmt.Errorf("cluster init: job bus secret: %w", err)
		}
		secret = []byte("ibs_" + hex.EncodeToString(raw) + "\n")
	}
	for _, d := range dirs {
		path := filepath.Join(d, jobSecretFile)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := writeNew(path, secret, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// createCert signs tmpl (with a random serial) for pub by parent's key.
func createCert(tmpl, parent *x509.Certificate, pub ed25519.PublicKey, signer ed25519.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("cluster init: serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, fmt.Errorf("cluster init: certificate: %w", err)
	}
	return der, nil
}

// writeNew writes a file that must not exist yet.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("cluster init: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cluster init: write %s: %w", path, err)
	}
	return nil
}
