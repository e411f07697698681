package tlsconf

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

// ErrExists is returned when a file to be written is there already: the
// tools never overwrite keys.
var ErrExists = errors.New("tlsconf: file exists")

// Default validity periods.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	CertValidity = 2 * 365 * 24 * time.Hour
)

// CA is a cluster CA that can sign certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed ECDSA P-256 CA valid from now for validity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"dsm"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("tlsconf: no randomness: " + err.Error())
	}
	return n.Add(n, big.NewInt(1))
}

// Request describes a certificate to issue.
type Request struct {
	// Node is the node id of a node certificate; ids.None with Client.
	Node ids.NodeID
	// Client asks for an operator's client certificate.
	Client bool
	// Addrs are more IP addresses or DNS names of a node certificate
	// (127.0.0.1 and localhost are always in it).
	Addrs []string
	// NotBefore and NotAfter bound the validity; zero: from now for
	// CertValidity.
	NotBefore, NotAfter time.Time
}

// Issued is a certificate and its key, PEM encoded.
type Issued struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// Issue signs a certificate for r with a fresh ECDSA P-256 key.
func (ca *CA) Issue(r Request) (*Issued, error) {
	if r.Client == (r.Node != ids.None) {
		return nil, errors.New("tlsconf: a certificate is for a node (an id from 1) or for a client, not both or neither")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: key: %w", err)
	}
	if r.NotBefore.IsZero() {
		r.NotBefore = time.Now().Add(-time.Minute)
	}
	if r.NotAfter.IsZero() {
		r.NotAfter = r.NotBefore.Add(CertValidity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		NotBefore:    r.NotBefore,
		NotAfter:     r.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if r.Client {
		tmpl.Subject = pkix.Name{CommonName: "client", Organization: []string{"dsm"}}
		tmpl.URIs = []*url.URL{ClientURI()}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.Subject = pkix.Name{CommonName: fmt.Sprintf("node-%d", r.Node), Organization: []string{"dsm"}}
		tmpl.URIs = []*url.URL{NodeURI(r.Node)}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
		for _, a := range r.Addrs {
			if ip := net.ParseIP(a); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if a != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, a)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: sign certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: sign certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: encode key: %w", err)
	}
	return &Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		Cert:    cert,
	}, nil
}

// CertPEM is the CA certificate, PEM encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM is the CA key, PEM encoded.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: encode CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// CreateCA makes a new CA and writes ca.pem and ca-key.pem (mode 0600)
// into dir, which is created if needed. It refuses to overwrite either.
func CreateCA(dir string) (*CA, error) {
	ca, err := NewCA("dsm cluster CA", CAValidity)
	if err != nil {
		return nil, err
	}
	key, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := writeNew(dir, map[string][]byte{CAFile: ca.CertPEM(), CAKeyFile: key}); err != nil {
		return nil, err
	}
	return ca, nil
}

// LoadCA reads ca.pem and ca-key.pem from dir.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("%w: CA: %v (make one with `dsmctl tls ca create`)", ErrFiles, err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("%w: CA key: %v", ErrFiles, err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrFiles, filepath.Join(dir, CAFile))
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: CA certificate: %v", ErrFiles, err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%w: %s holds no PEM key", ErrFiles, filepath.Join(dir, CAKeyFile))
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: CA key: %v", ErrFiles, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: CA key is no signing key", ErrFiles)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrFiles, filepath.Join(dir, CAFile))
	}
	return &CA{Cert: cert, Key: signer}, nil
}

// WriteIssued writes is into dir under the names FilesIn gives r's
// holder, and returns them. With replace, existing files are replaced
// (atomically, by rename: a process reloading meanwhile reads either the
// old pair or the new one, the key first); without it they are refused.
func WriteIssued(dir string, r Request, is *Issued, replace bool) (Files, error) {
	f := FilesIn(dir, r.Node)
	files := map[string][]byte{filepath.Base(f.Key): is.KeyPEM, filepath.Base(f.Cert): is.CertPEM}
	if !replace {
		return f, writeNew(dir, files)
	}
	for _, name := range []string{filepath.Base(f.Key), filepath.Base(f.Cert)} {
		if err := replaceFile(filepath.Join(dir, name), files[name]); err != nil {
			return f, err
		}
	}
	return f, nil
}

func writeNew(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("tlsconf: %w", err)
	}
	for name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("%w: %s (remove it first, or use another --dir)", ErrExists, filepath.Join(dir, name))
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return fmt.Errorf("tlsconf: %w", err)
		}
	}
	return nil
}

func replaceFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("tlsconf: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tlsconf: %w", err)
	}
	return nil
}
