package federation

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Federation links are TLS 1.3. The embedded NATS server presents a
// self-signed certificate whose key is the directory key itself, made in
// memory at every start; a dialing directory accepts the server only when
// the certificate's public key is the key pinned for that peer. The peer
// line's key is therefore all a peer needs: no certificate files, no CA,
// and a stolen certificate without the directory key is useless, since TLS
// 1.3 makes the server prove it holds the key.

// serverTLS returns the TLS configuration of the embedded NATS server of the
// directory with key priv and domain.
func serverTLS(priv ed25519.PrivateKey, domain string) (*tls.Config, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("federation certificate: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: domain},
		DNSNames:              []string{domain},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		return nil, fmt.Errorf("federation certificate: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}},
	}, nil
}

// PeerTLS returns the TLS configuration for dialing the NATS server of a
// peer whose directory key is pinned: only a server proving that key is
// accepted. Names and certificate chains are not consulted; the pin is the
// trust.
func PeerTLS(pinned ed25519.PublicKey) *tls.Config {
	want := bytes.Clone(pinned)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Chain and name checks are replaced by the pin below.
		InsecureSkipVerify: true, //nolint:gosec // verified by VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("federation: the peer presented no certificate")
			}
			cert, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return fmt.Errorf("federation: peer certificate: %w", err)
			}
			got, ok := cert.PublicKey.(ed25519.PublicKey)
			if !ok || !bytes.Equal(got, want) {
				return errors.New("federation: the peer's certificate is not for its pinned directory key")
			}
			return nil
		},
	}
}
